"""triton_emulation: the fused MoE that users run where the hardware has no native FP4/FP6 support.

Weight codes stay in checkpoint layout (FP4 packed two per byte, E8M0/E4M3 block scales) and are
dequantized inside the GEMM kernels; activations are quantized by bit-exact Triton quantizers; the
gate/up GEMM and the activation are one kernel; the top-k sum is a deterministic reduction. On CPU the
kernels run under the Triton interpreter (small shapes, fp32 dots); on a GPU, compiled.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import torch

from reference.checkpoints import MoECheckpoint, nvfp4_decode_scale
from reference.formats import FloatFormat
from reference.fp8 import Granularity
from reference.moe import check_moe_inputs, static_activation_scales
from reference.mx import ScaleMode
from harness.platforms import default_device, detect_platform, matrix_unit_truncation
from reference.quantizers import FP8, MX, NVFP4
from reference.structure import STRUCTURES

from . import triton_kernels as K
from .gluon_kernels import BF16_GATED_OUTPUTS, BF16_UNGATED_OUTPUTS
from .triton_kernels import triton
from triton.tools.tensor_descriptor import TensorDescriptor

_ACT_IDS = {"SILU": 0, "GELU": 1, "GELU_TANH": 2, "RELU2": 3, "SWIGLUOAI": 4, "SWIGLUSTEP": 5, "SITU": 6}
_W_KIND = {None: 0, MX: 1, NVFP4: 2, FP8: 3}  # the kernel's W_KIND (triton_kernels.W_BF16 ...)


# What the GEMM kernel reads besides the codes, per weight kind: "codes" block-scale codes decoded in the
# tile (MX E8M0, NVFP4 E4M3), "expert" one fp32 per expert on the accumulator (NVFP4 global decode scale,
# FP8 per-tensor scale), "block" fp32 128x128 FP8 scales on each K step's partial sum
def _mx_scales(w, wq, ckpt):
    return dict(codes=w.scale)


def _nvfp4_scales(w, wq, ckpt):
    return dict(codes=w.scale, expert=nvfp4_decode_scale(w.global_scale, ckpt.nvfp4_global_convention).float())


def _fp8_scales(w, wq, ckpt):
    if wq.granularity is Granularity.PER_TENSOR:
        return dict(expert=w.scale.reshape(-1).float())
    if tuple(wq.block_shape) != (128, 128):
        raise ValueError(f"triton_emulation takes FP8 weight blocks of 128x128, got {wq.block_shape}")
    return dict(block=w.scale.float())


_WEIGHT_SCALES = {MX: _mx_scales, NVFP4: _nvfp4_scales, FP8: _fp8_scales}


def _fmt_args(fmt: FloatFormat) -> dict:
    return dict(MBITS=fmt.mbits, EMIN=fmt.emin, EMAX=fmt.emax, MAX_CODE=fmt.max_code, SIGN_BIT=fmt.sign_bit,
                EBITS=fmt.ebits, BIAS=fmt.bias)


@dataclass
class Prepared:
    ckpt: MoECheckpoint
    w13: torch.Tensor
    w13_scale: torch.Tensor | None
    w2: torch.Tensor
    w2_scale: torch.Tensor | None
    w13_expert_scale: torch.Tensor | None  # [E] fp32: NVFP4 global decode / FP8 per-tensor weight scale
    w2_expert_scale: torch.Tensor | None
    w13_block_scale: torch.Tensor | None  # [E, N/128, K/128] fp32 (FP8 block weights)
    w2_block_scale: torch.Tensor | None
    b13: torch.Tensor | None
    b2: torch.Tensor | None
    a1_scale: torch.Tensor | None
    a2_scale: torch.Tensor | None
    constexprs: dict = field(default_factory=dict)  # a subclass's kernel switches for this checkpoint
    extras: dict = field(default_factory=dict)  # a subclass's own tensors for its own launches


# The routing glue in one Triton program up to this many pairs (moe_align_kernel, an O(P^2) rank count in
# 16-pair chunks), compared with _align_torch bit for bit under the interpreter and compiled on an H200
# (results/gpu-issue15-bitplace/run-11c19d4: 521 conformance cases with it; gpt-oss 8 tokens 230 -> 170 us).
FUSED_ALIGN_MAX_PAIRS = 1024
# moe_align_kernel's steps: sentinels FILL slots a store, block experts stored by expert, the pairs' slots from
# their sorted (expert, pair) keys instead of 16-slot stores, CHUNK x BLOCK_E compares and CHUNK x BLOCK_P compares
# a step (the kernel took 22.7 us of gpt-oss-120b's 613 us forward at 64 tokens on an H100, results/gpu-issue28/run-30)
FUSED_ALIGN_STEPS = dict(FILL=1024, OWNER_BY_EXPERT=True, RANK_SORT=True)

TILE_KEYS = ("block_m", "block_n", "block_k", "num_warps", "num_stages", "w2_block_n", "maxnreg", "mma_steps",
             "split_k", "mma_overlap", "w2_mma_overlap", "pdl", "persistent", "group_m", "tma", "tail_m",
             "serial_k", "warp_spec", "inline_tails", "quant_launch", "scale_regs", "w13_prefetch", "tile_major",
             "gluon_prefill", "gluon_bf16", "tail_warps", "tail_block_n")
# optional keys: w2_block_n (GEMM2's N tile where it differs from GEMM1's), maxnreg (a register cap per thread, so
# that more programs fit on a multiprocessor; 0 = the compiler's choice), mma_steps (triton_bitplace: MMA steps per
# 128-value chunk, 1 or 2; 2 holds half the decoded tile in registers), split_k (triton_bitplace: the K chunks
# shared among this many programs per tile, fp32 partial sums added in order by splitk_epilogue_kernel: more
# programs when few tokens leave SMs idle), mma_overlap (triton_bitplace_gluon: the consumer's schedule, 0-2,
# triton_bitplace.GLUON_OVERLAP; w2_mma_overlap GEMM2's, one tile a step, where it differs), pdl (triton_bitplace_gluon
# at decode: 1 launches the chain as programmatic dependents, triton_kernels.PDL_ORDER, GEMM2 prefetching its weights
# into L2 before its wait; 2 likewise without the prefetch), persistent (triton_bitplace_gluon: 1 runs each GEMM as
# a persistent grid of the programs that fit at once, one ring a program across its work items; opt-in, slower in
# results/gpu-issue28/run-13; moe_gemm_kernel, unsplit: that many programs a multiprocessor, each computing the used
# blocks' tiles in turn in one loop Triton flattens, PERSISTENT; opt-in: bit for bit, but 1.1-1.3x slower in bf16 and
# 2x in FP4 prefill on the H200, results/gpu-issue28/run-19), group_m
# (moe_gemm_kernel: the tiles in groups of this many row blocks, each group's N blocks in turn, so that the programs
# resident together share activation rows and weight columns through L2; triton_kernels.grouped_tile_order; 0 = row
# blocks fastest), tma (moe_gemm_kernel: 1 the activation rows gathered block by block into a copy that TMA boxes read,
# gather_block_rows, and bf16 weights by TMA too: _k_loop_tma; the bit-placement loop's activations likewise; 2 the
# bf16 weights only, the activations by pointers, no copy), tail_m (each expert's rows padded to tail_m, not block_m: the
# blocks of block_m rows in one launch, the tail blocks left, tail_m rows each, in a second one; split_tail_blocks;
# prefill only, not with split-K; a table row may give fit_tail_m 1 instead: tail_m then is fit_tail_m's choice for the
# mean rows an expert of the call, and the row's inline_tails holds only where that choice is half a block; tail_warps,
# tail_block_n: the tail launch's num_warps and N tile (both GEMMs') where they differ, so that a tail tile of few rows, whose K loop decodes as many weights
# for a quarter of the MMAs, need not hold a multiprocessor alone: NVFP4 W4A16's 32-row tail launches at 8 warps, one
# program a multiprocessor, ran the tensor pipe 20-23% busy for 16% of gpt-oss-120b's prefill, results/gpu-issue28/
# run-39), serial_k (moe_gemm_kernel with split_k: 1 finishes each tile in the GEMM's own
# launch, its last split adding the partial sums in order and running the epilogue, SERIAL_K, where
# splitk_epilogue_kernel would run: one launch fewer; GEMM2's top-k sum stays its own launch), warp_spec (the bf16 TMA
# loop with tma 1 and 128-row tiles warp-specialized by Triton's sm90 pass: a producer warpgroup, and num_warps warps
# doubled into two consumer warpgroups; _check_warp_spec; 2: the same device descriptors and row pairs, unspecialized,
# the bisect of results/gpu-issue28/run-24). A table row may give warp_spec_if_fits 1 instead (warp_spec
# where the model's sizes allow it, else twice the warps unspecialized), inline_tails (with tail_m = block_m / 2: 1
# runs the tail blocks in the GEMM's one launch, each right after its expert's full blocks, at tail_m rows; the
# kernel's TAIL_M; not with tma 1, warp_spec or a persistent grid), quant_launch (NVFP4 W4A4: 1 quantizes each GEMM's
# input in its own nvfp4_quantize_kernel launch, not in the routing launch (decode) and GEMM1's epilogue; the same
# bits: at prefill a tile that holds a multiprocessor alone cannot hide that epilogue under another program's K loop),
# scale_regs (the bit-placement loop, mma_steps 1: 1 loads each K step's block scales one step ahead into registers
# by plain loads, not through the pipeline's shared-memory buffers: the kernel's SCALE_REGS, the same bits; NVFP4's
# 128-row 4-warp GEMM1 then takes 112 KB, not 114, and two programs fit a multiprocessor), w13_prefetch
# (triton_bitplace_gluon with pdl, at most 16 tokens: each GEMM1 program's first that many K chunks of weights into L2
# before its wait for the routing launch, its block's expert ranked from the expert ids; gluon_kernels' PDL 3),
# tile_major (triton_bitplace_gluon: its GEMMs read a tile-major copy of the weights, each 64-row tile's K steps one
# contiguous run, where the rows are whole 64-row tiles; prepared when configured before prepare() or by
# MOE_CONFORMANCE_GLUON_TILE_MAJOR=1), gluon_prefill (triton_bitplace_gluon: 1 runs blocks of block_m 32, 64 or 128
# pairs through the Gluon kernel too, the whole K a program and the epilogue from its accumulators; block_n 64 or 128
# its consumer warpgroups' rows, maxnreg their register cap, group_m the programs' order), gluon_bf16 (bf16 weights
# and activations: 1 runs each GEMM through gluon_kernels.bf16_prefill_kernel, a producer warpgroup streaming the
# weights by TMA and the rows by cp.async, two consumer warpgroups issuing wgmma from shared memory, the epilogue
# from the accumulators; block_m 64 or 128 its expert blocks, 128 outputs a program gated and 256 ungated (resolve_tiles
# sets block_n / w2_block_n so), num_stages the ring's depth, maxnreg the consumers' register cap, persistent 1 one
# program a multiprocessor running the items in turn, the next one's loads under the last one's MMAs and epilogue), and
# split_k_programs instead: split_k then is the fewest splits that give GEMM1 that many programs (split_k_to_fill),
# and pdl_bytes: pdl 1 where GEMM2's weights of the call (one expert a pair at most) are at most that many bytes,
# else 2
# (max pairs, kinds or None for any, tiles), first match wins (table_row_matches: a kind is a weight kind, or a
# (weight kind, activation kind) pair for one scheme's rows). Decode rows from the H200 sweep
# of tools/tune_moe.py --quick (results/gpu-issue8/tune.json); prefill rows from its prefill sweep, the bf16 row from
# results/gpu-issue28/run-14 (8192 tokens, group_m 8: gpt-oss-120b 41.9 -> 48.2% of dense bf16 with 4 stages, Kimi-K2
# 36.6 -> 41.0%; 64-row and 64-column tiles slower at both), run-15 / run-16 (both operands by TMA, 3 stages: 45.2 ->
# 51.2%, 38.9 -> 44.0%; tail_m 32 / 64 slower: the tail launch streams its experts' weights a second time, and bf16
# weights are half of the time at Kimi-K2's 171 rows an expert) and run-18 (the weights alone by TMA, tma 2, against
# both: gpt-oss-120b 4060 -> 3821 us, Kimi-K2 16280 -> 16551 us, and no gathered copy of the activations: 1.6 GB at
# Kimi-K2's 8192 tokens), run-19 (GEMM2 at 256 columns, w2_block_n: Kimi-K2 16236 -> 15387 us, gpt-oss-120b even;
# make bench 48.2 -> 51.3% / 44.0 -> 46.5%) and its second sweep (4 stages with it: gpt-oss-120b 3710 -> 3581 us,
# Kimi-K2 even), run-23's PART=inline (tail_m 64, the tail blocks in the same launch: gpt-oss-120b 3575 -> 3540 us,
# its 256 rows an expert leave no tails; Kimi-K2 15983 -> 14414 us, where two launches were 18197 us).
# The bf16 prefill row warp-specialized by Triton (warp_spec: both operands by TMA, a producer warpgroup and two
# consumer warpgroups of 4 warps, in place of 8 warps with the activations by pointers), where a model's sizes allow it
# (warp_spec_if_fits, resolve_tiles); compiled for sm90 by Triton 3.6 and 3.9, not yet timed
# (results/gpu-issue28/run-23). MOE_CONFORMANCE_BF16_WARP_SPEC=1 makes it the table's row for the A/B.
BF16_PREFILL_WARP_SPEC = os.environ.get("MOE_CONFORMANCE_BF16_WARP_SPEC", "0") == "1"
# The bf16 prefill row through the Gluon kernel (gluon_bf16: gluon_kernels.bf16_prefill_kernel, the loads in a producer
# warpgroup, both wgmma operands from shared memory; why: the row above runs loads, MMAs and epilogue in the same 8
# warps, at 46-55% of dense bf16 on an H100, results/gpu-issue28/run-34); 128-pair blocks with 64-pair tails inline
# (Kimi-K2's ~171 rows an expert: 1.12x the MMAs, not 1.5x), one persistent program a multiprocessor. Compiled for
# sm90 by Triton 3.6 without spills (224 KB of shared memory at 4 stages); on an H100 bit for bit with the row
# below at both models' sizes (results/gpu-issue28/run-37) and slower (run-38, gpt-oss-120b 8192 tokens, replay wall
# time: the row below 3572.4 us; these tiles 4874.6, without inline tails 3881.9 persistent / 3999.5 not, 64-pair
# blocks 4604.2): opt-in. MOE_CONFORMANCE_GLUON_BF16=1 makes it the table's row for the A/B (sm90 only).
# Why both rewrites lost (Nsight Compute on an H100, results/gpu-issue28/run-39, gpt-oss-120b 8192 tokens): the row
# below is bound by L2 bandwidth (GEMM1 L2 96% busy, DRAM 74%, tensor pipe 63%): a 128 x 256 tile reads 85 FLOP a
# byte from L2 whoever issues its loads. Fewer L2 bytes a FLOP (two programs of a cluster sharing a tile by TMA
# multicast, which Triton 3.6 does not lower) is the lever left.
GLUON_BF16_PREFILL = os.environ.get("MOE_CONFORMANCE_GLUON_BF16", "0") == "1"
GLUON_BF16_TILES = dict(block_m=128, block_n=128, block_k=64, num_warps=4, num_stages=4, maxnreg=168, group_m=8,
                        w2_block_n=256, tail_m=64, inline_tails=1, persistent=1, gluon_bf16=1)
_BF16_PREFILL = (dict(block_m=128, block_n=128, block_k=64, num_warps=4, num_stages=2, group_m=8, tma=1,
                      warp_spec_if_fits=1, w2_block_n=256) if BF16_PREFILL_WARP_SPEC else
                 GLUON_BF16_TILES if GLUON_BF16_PREFILL else
                 dict(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=4, group_m=8, tma=2,
                      w2_block_n=256, tail_m=64, inline_tails=1))
TILE_TABLE = (
    (1024, (None,), dict(block_m=16, block_n=32, block_k=128, num_warps=4, num_stages=4)),  # bf16 weights
    (1024, None, dict(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=3)),
    (1 << 62, (None,), _BF16_PREFILL),
    (1 << 62, None, dict(block_m=128, block_n=64, block_k=64, num_warps=8, num_stages=3, group_m=8)),
)


def gather_block_rows(a: torch.Tensor, sorted_rows: torch.Tensor, n_pairs: int, a_row_div: int) -> torch.Tensor:
    """The activation rows of every expert block in block order (row b x BLOCK_M + i: the row of pair
    sorted_rows[b x BLOCK_M + i]), so that one TMA box reads a block's rows; a padding slot (pair id n_pairs)
    copies the last pair's row, whose products no output of the slot stores."""
    return a.index_select(0, sorted_rows.clamp(max=n_pairs - 1) // a_row_div)


def split_tail_blocks(sorted_rows: torch.Tensor, block_expert: torch.Tensor, tail_m: int, block_m: int,
                      num_experts: int, n_pairs: int):
    """_align's blocks of tail_m rows regrouped for two launches: (sorted_rows, block_expert) of the blocks of
    block_m rows (each a run of block_m / tail_m consecutive small blocks of one expert) and of the tail blocks that
    are left (fewer than block_m / tail_m an expert), both in _align's layout (padding slots n_pairs, unused blocks
    expert -1) and sized for the worst case on the device, so that nothing is read back to the host. Each expert's
    rows are then padded to a multiple of tail_m, not of block_m, while most rows run in the big tiles: Kimi-K2's
    171 rows an expert at 8192 tokens fill 67% of two 128-row blocks, 89% of one 128-row and one 64-row block."""
    ratio = block_m // tail_m
    dev = block_expert.device
    be = block_expert.long()
    counts = torch.zeros(num_experts, dtype=torch.long, device=dev).scatter_add_(0, be.clamp(min=0), (be >= 0).long())
    start = torch.cumsum(counts, 0) - counts  # an expert's first small block (_align lays experts out in order)
    big, tail = counts // ratio, counts % ratio
    small_rows = sorted_rows.view(-1, tail_m)
    n_small = small_rows.shape[0]

    def regroup(per_expert, n_slots, first_small, width):
        end = torch.cumsum(per_expert, 0)
        slot = torch.arange(n_slots, device=dev)
        e = torch.searchsorted(end, slot, right=True).clamp(max=num_experts - 1)
        used = slot < end[-1]
        first = first_small(e, slot - (end[e] - per_expert[e]))
        idx = (first[:, None] + torch.arange(width, device=dev)).clamp(max=n_small - 1)
        rows = torch.where(used[:, None, None], small_rows[idx], n_pairs).reshape(-1)
        return rows.to(torch.int32), torch.where(used, e, -1).to(torch.int32)

    big_blocks = regroup(big, n_small // ratio, lambda e, j: start[e] + j * ratio, ratio)
    tail_blocks = regroup(tail, min(n_small, (ratio - 1) * num_experts), lambda e, j: start[e] + big[e] * ratio + j, 1)
    return big_blocks, tail_blocks


def inline_tail_blocks(sorted_rows: torch.Tensor, block_expert: torch.Tensor, tail_m: int, num_experts: int,
                       n_pairs: int):
    """_align's blocks of tail_m rows regrouped for one launch of 2 tail_m-row blocks (inline_tails): each expert's
    full blocks (two consecutive small blocks), then its short block where a small block is left (its rows in the
    first tail_m slots, padding slots n_pairs after them), experts in order. (sorted_rows, block_expert, short:
    int32, 1 for a short block), in _align's layout (unused blocks expert -1), sized for the worst case on the
    device. A short block follows its expert's full blocks, so that the grid's grouped order runs them together and
    the expert's weights are read from L2, not from memory a second time as by a tail launch."""
    dev = block_expert.device
    be = block_expert.long()
    counts = torch.zeros(num_experts, dtype=torch.long, device=dev).scatter_add_(0, be.clamp(min=0), (be >= 0).long())
    start = torch.cumsum(counts, 0) - counts  # an expert's first small block (_align lays experts out in order)
    full, short = counts // 2, counts % 2
    per_expert = full + short
    end = torch.cumsum(per_expert, 0)
    small_rows = sorted_rows.view(-1, tail_m)
    n_small = small_rows.shape[0]
    slot = torch.arange(n_small // 2 + min(num_experts, n_small), device=dev)
    e = torch.searchsorted(end, slot, right=True).clamp(max=num_experts - 1)
    used = slot < end[-1]
    j = slot - (end[e] - per_expert[e])  # the block's place among its expert's
    is_short = used & (j == full[e])
    first = (start[e] + 2 * j).clamp(max=n_small - 1)
    second = torch.where(is_short[:, None], torch.full_like(small_rows[:1], n_pairs),
                         small_rows[(first + 1).clamp(max=n_small - 1)])
    rows = torch.cat([small_rows[first], second], dim=1)
    rows = torch.where(used[:, None], rows, n_pairs).reshape(-1)
    return rows.to(torch.int32), torch.where(used, e, -1).to(torch.int32), is_short.to(torch.int32)


ALIGN_CHUNK = 256  # pairs a program of align_count_kernel and align_scatter_kernel
# splitk_epilogue_kernel's programs as tall as the call's pairs (up to 16): at one token 4 (gpt-oss-120b) or 8 pairs
# (Kimi-K2), not 16 of which most idle through the activation and GEMM1's NVFP4 quantization of GEMM2's input. On the
# H200 (results/gpu-issue28/run-25/timing-epilogue) make bench's one-token gluon rows: NVFP4 W4A4 gpt-oss-120b 43.9 ->
# 40.8 us, Kimi-K2 99.5 -> 97.0, MXFP4 and NVFP4 W4A16 equal or faster; bit for bit under the interpreter
# (suites/test_fp4_bits.py); compiled on the H200 not yet checked (results/gpu-issue28/run-27 PART=check).
# MOE_CONFORMANCE_EPILOGUE_FIT_PAIRS=0: 16 pairs a program always (the A/B baseline).
EPILOGUE_FIT_PAIRS = os.environ.get("MOE_CONFORMANCE_EPILOGUE_FIT_PAIRS", "1") == "1"
# MOE_CONFORMANCE_PREFILL_ALIGN_TORCH=1: the prefill routing in torch ops again (align_layouts_torch), for an A/B
PREFILL_ALIGN_TORCH = os.environ.get("MOE_CONFORMANCE_PREFILL_ALIGN_TORCH", "0") == "1"


def align_layouts(topk_ids: torch.Tensor, num_experts: int, block_m: int, tail_m: int = 0, inline: bool = False):
    """The routing glue at any number of pairs in three launches (align_count_kernel, align_layout_kernel,
    align_scatter_kernel), where _align_torch and split_tail_blocks / inline_tail_blocks take some ninety torch
    launches (~230 us of kernels before the first GEMM at 8192 tokens on the H200, results/gpu-issue28/run-24): the
    (sorted_rows, block_expert, short) of each launch of a GEMM, the same arrays as theirs bit for bit, same sizes.
    tail_m 0: _align_torch's blocks of block_m rows (short None); tail_m, not inline: split_tail_blocks' big blocks
    and its tail blocks (two layouts); inline (block_m = 2 tail_m): inline_tail_blocks', whose rows are the
    block_m layout's (an expert's short block holds its last pairs, at most tail_m, then padding)."""
    if tail_m and (tail_m >= block_m or block_m % tail_m) or inline and block_m != 2 * tail_m:
        raise ValueError(f"align_layouts takes tail_m 0 or a divisor of block_m below it, and inline only with block_m "
                         f"= 2 tail_m; got block_m {block_m}, tail_m {tail_m}, inline {inline}")
    flat = topk_ids.reshape(-1)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    p = flat.numel()
    dev = flat.device
    block_e = triton.next_power_of_2(num_experts)
    n_chunks = triton_cdiv(p, ALIGN_CHUNK)
    mode = 2 if tail_m and inline else 1 if tail_m else 0
    n_small = triton_cdiv(p, tail_m) + min(num_experts, p) if tail_m else 0
    big_blocks = (n_small // 2 + min(num_experts, n_small) if mode == 2 else n_small // (block_m // tail_m)
                  if mode == 1 else triton_cdiv(p, block_m) + min(num_experts, p))
    tail_blocks = min(n_small, (block_m // tail_m - 1) * num_experts) if mode == 1 else 0
    i32 = dict(dtype=torch.int32, device=dev)
    chunk_counts = torch.empty(n_chunks, block_e, **i32)
    chunk_base = torch.empty(n_chunks, block_e, **i32)
    expert = torch.empty(3, block_e, **i32)
    rows_big, experts_big = torch.empty(big_blocks * block_m, **i32), torch.empty(big_blocks, **i32)
    rows_tail, experts_tail = torch.empty(tail_blocks * tail_m, **i32), torch.empty(tail_blocks, **i32)
    short = torch.empty(big_blocks if mode == 2 else 0, **i32)
    consts = dict(BLOCK_M=block_m, TAIL_M=tail_m or block_m, MODE=mode, BLOCK_E=block_e)
    K.align_count_kernel[(n_chunks,)](flat, chunk_counts, p, BLOCK_E=block_e, CHUNK=ALIGN_CHUNK, num_warps=4)
    K.align_layout_kernel[(1,)](chunk_counts, chunk_base, expert, rows_big, experts_big, rows_tail, experts_tail,
                                short, n_chunks, p, num_experts, big_blocks, tail_blocks, FILL=1024, SCAN=16, num_warps=8,
                                **consts)
    K.align_scatter_kernel[(n_chunks,)](flat, chunk_base, expert, rows_big, rows_tail, p, CHUNK=ALIGN_CHUNK, STEP=32,
                                        num_warps=4, **consts)
    if mode == 1:
        return [(rows_big, experts_big, None), (rows_tail, experts_tail, None)]
    return [(rows_big, experts_big, short if mode == 2 else None)]


def align_layouts_torch(topk_ids: torch.Tensor, num_experts: int, block_m: int, tail_m: int = 0,
                        inline: bool = False):
    """align_layouts in torch ops (_align_torch, then split_tail_blocks or inline_tail_blocks): its oracle in
    suites/test_triton_helpers.py, and its stand-in where launches are recorded, not run (compile_check)."""
    p = topk_ids.numel()
    rows, block_expert = TritonEmulationBackend._align_torch(topk_ids, num_experts, tail_m or block_m)
    if not tail_m:
        return [(rows, block_expert, None)]
    if inline:
        return [inline_tail_blocks(rows, block_expert, tail_m, num_experts, p)]
    big, tail = split_tail_blocks(rows, block_expert, tail_m, block_m, num_experts, p)
    return [(*big, None), (*tail, None)]


def scheme_kinds(scheme) -> tuple:
    """(weight kind, activation kind) of a scheme, None for bf16 weights or activations: what a tile table row
    names."""
    return tuple(None if q is None else q.kind for q in (scheme.weight, scheme.act))


def table_row_matches(kinds, weight_kind, act_kind=None) -> bool:
    """A tile table row's kinds (None: any scheme) against a launch's: each kind is a weight kind (any
    activations) or a (weight kind, activation kind) pair."""
    return kinds is None or weight_kind in kinds or (weight_kind, act_kind) in kinds


TAIL_M_CHOICES = (32, 64)


def fit_tail_m(rows_per_expert: float, block_m: int) -> int:
    """The tail_m (of TAIL_M_CHOICES, below block_m; 0 where none is) that leaves an expert of rows_per_expert rows
    the fewest tail blocks as split_tail_blocks lays them out (its rows rounded up to tail_m, as many whole block_m
    blocks as fit, the rest in tail_m blocks), the smaller on a tie (fewer padded rows). A bit-placement tile decodes
    the same weights whatever its rows, so a tail block costs about the same at 32 rows as at 64: the count decides.
    On the H200 at 8192 tokens (results/gpu-issue28/run-16, run-19, run-20): gpt-oss-120b's 256 rows an expert give
    no tail at either, and 32 ran 2.4-2.6% faster; Kimi-K2's 171 give two 32-row tails or one 64-row tail, and 64 ran
    7.3-8.2% faster."""
    rows = math.ceil(rows_per_expert)

    def tails(t: int) -> int:
        return triton_cdiv(rows, t) % (block_m // t)

    fits = [t for t in TAIL_M_CHOICES if t < block_m and block_m % t == 0]
    return min(fits, key=lambda t: (tails(t), t)) if fits else 0


class TritonEmulationBackend:
    name = "triton_emulation"
    operand_dtype = torch.float32  # operands are exact in bf16; scales multiply fp32 partial sums
    # bf16 after each GEMM and after the fp32-evaluated activation; topk_reduce_kernel weights the rounded
    # GEMM2 rows and sums them in fp32; static FP8 scales divide (fp8_quantize_kernel)
    numerical_structure = STRUCTURES["rounded_terms"]
    use_dot_scaled = False  # triton_dot_scaled's GEMMs use tl.dot_scaled on the MX weights
    min_block_k = 16
    # epilogues that do the next step too: GEMM1's of NVFP4 W4A4 the activation quantization (any GEMM), with
    # split-K (triton_bitplace at decode) GEMM2's the top-k sum (splitk_topk_reduce_kernel); bit for bit the
    # launches they replace (suites/test_fp4_bits.py)
    fold_epilogues = True

    def __init__(self, device: str | None = None):
        self.device = device or default_device()
        # compiled, its tl.dot runs on the GPU's bf16 matrix units (harness.platforms: they truncate)
        self.accumulation_truncation = matrix_unit_truncation("cpu" if K.INTERPRET else self.device)
        self.tiles: dict | None = None  # fixed tiles (configure()); None: TILE_TABLE by pair count
        self.last_compiled: dict = {}  # "w13"/"w2" -> the compiled kernel of the last launch (tools/kernel_report.py)
        self.last_launch: dict = {}  # "w13"/"w2" -> (grid, tiles) of the last launch (harness/bench/diagnosis.py)
        self._tile_counts: dict = {}  # device -> [int32 zeros]: SERIAL_K's arrivals a tile (each tile resets its own)

    def configure(self, **params) -> "TritonEmulationBackend":
        """Fix tile sizes and launch parameters (block_m, block_n, block_k, num_warps, num_stages) instead
        of the tile table's choice (tools/tune_moe.py sweeps them)."""
        unknown = set(params) - set(TILE_KEYS)
        if unknown:
            raise ValueError(f"unknown launch parameters {sorted(unknown)}; expected some of {TILE_KEYS}")
        # from the table's decode row less its optional keys, never from the previous configure(): a key left
        # out takes the kernel's default, not what a table row or an earlier sweep point set (the decode row's
        # split_k_programs would otherwise split K, unrecorded, in every sweep point that does not name split_k)
        self.tiles = None
        base = {k: v for k, v in self.tile_config(1, None).items() if k in TILE_KEYS[:5]}
        self.tiles = {**base, **{k: int(v) for k, v in params.items()}}
        return self

    def resolve_tiles(self, tiles: dict, prepared: Prepared, p: int, dev) -> dict:
        """A tile table row's rules resolved where the launch's grids are known (p pairs of `prepared`'s model)."""
        ckpt = prepared.ckpt
        if "split_k_programs" in tiles:
            tiles = split_k_to_fill(tiles, min(ckpt.num_experts, p) * triton_cdiv(ckpt.intermediate_size,
                                                                                tiles["block_n"]))
        if "pdl_bytes" in tiles:  # programmatic dependent launches, GEMM2 prefetching its weights into L2 where they
            # (at most one expert per pair) are at most that many bytes, so that the prefetch under GEMM1 stays in L2
            w2_bytes = min(ckpt.num_experts, p) * sum(t[0].numel() * t.element_size() for t in
                                                      (prepared.w2, prepared.w2_scale) if t is not None)
            tiles = {**{k: v for k, v in tiles.items() if k != "pdl_bytes"},
                     "pdl": 1 if w2_bytes <= tiles["pdl_bytes"] else 2}
        if "fit_tail_m" in tiles:  # tail_m by the mean rows an expert (p pairs over the experts: no host sync)
            fit = tiles["fit_tail_m"]
            tiles = {k: v for k, v in tiles.items() if k != "fit_tail_m"}
            if fit:
                tiles["tail_m"] = fit_tail_m(p / ckpt.num_experts, tiles["block_m"])
            if tiles.get("inline_tails") and tiles.get("tail_m") != tiles["block_m"] // 2:
                tiles["inline_tails"] = 0  # a row's inline_tails holds where the fitted tail is half a block
        if "warp_spec_if_fits" in tiles:  # warp_spec where both GEMMs of this model compile with it (_check_warp_spec:
            # bf16 weights, TMA strides, 128-row tiles and tails, the plain grid, row pairs of whole boxes), else the
            # tuned unspecialized row (twice the warps, the weights alone by TMA)
            want = tiles["warp_spec_if_fits"]
            tiles = {k: v for k, v in tiles.items() if k != "warp_spec_if_fits"}
            act = ckpt.activation
            pairs = act.gated and act.interleaved
            fits = (want and ckpt.scheme.weight is None and ckpt.hidden_size % 8 == 0
                    and ckpt.intermediate_size % 8 == 0 and tiles.get("tma") == 1 and tiles["block_m"] >= 128
                    and (tiles.get("tail_m") or 128) >= 128 and not tiles.get("persistent")
                    and not (pairs and ckpt.hidden_size % tiles["block_k"]))
            tiles = {**tiles, "warp_spec": 1} if fits else {**tiles, "num_warps": 2 * tiles["num_warps"], "tma": 2}
        if tiles.get("gluon_bf16"):  # the Gluon kernel's outputs a program: 128 gated (gate and up rows), 256 ungated
            tiles = {**tiles, "block_n": BF16_GATED_OUTPUTS.value if ckpt.activation.gated else
                     BF16_UNGATED_OUTPUTS.value, "w2_block_n": BF16_UNGATED_OUTPUTS.value}
        if K.INTERPRET and tiles.get("pdl"):  # no griddepcontrol in the interpreter; dependents change timing only
            tiles = {**tiles, "pdl": 0}
        return tiles

    def tile_config(self, n_pairs: int, weight_kind: str | None, act_kind=None) -> dict:
        """Tiles for a launch: the fixed ones, or the first TILE_TABLE row that matches (measured on the
        H200 with tools/tune_moe.py; BENCHMARKS.md). The interpreter keeps small tiles."""
        if self.tiles is not None:
            return self.tiles
        if K.INTERPRET:
            return dict(block_m=16, block_n=64, block_k=64, num_warps=4, num_stages=2)
        for max_pairs, kinds, cfg in TILE_TABLE:
            if n_pairs <= max_pairs and table_row_matches(kinds, weight_kind, act_kind):
                return dict(cfg, block_k=max(cfg["block_k"], self.min_block_k))
        raise AssertionError("TILE_TABLE ends with a catch-all row")

    # ---- protocol --------------------------------------------------------------------------------
    def supports(self, problem, platform) -> tuple[bool, str]:
        if problem.activation.formula not in _ACT_IDS:
            return False, f"no Triton activation for {problem.activation.name}"
        return True, "Triton kernels: weights dequantized in the GEMM, every scheme and activation"

    def available(self, platform) -> tuple[bool, str]:
        # FP8 codes are integer arithmetic here, so any platform's semantics run on any device
        return True, ""

    def prepare(self, ckpt: MoECheckpoint) -> Prepared:
        dev = self.device
        wq = ckpt.scheme.weight

        scales = {n: ({} if wq is None else _WEIGHT_SCALES[wq.kind](getattr(ckpt, n), wq, ckpt)) for n in ("w13", "w2")}
        on_dev = lambda t: None if t is None else t.contiguous().to(dev)  # noqa: E731

        a1_scale, a2_scale = static_activation_scales(ckpt)
        f32 = lambda t: None if t is None else t.float().contiguous().to(dev)  # noqa: E731
        return Prepared(
            ckpt, ckpt.w13.data.contiguous().to(dev), on_dev(scales["w13"].get("codes")), ckpt.w2.data.contiguous().to(dev),
            on_dev(scales["w2"].get("codes")), on_dev(scales["w13"].get("expert")), on_dev(scales["w2"].get("expert")),
            on_dev(scales["w13"].get("block")), on_dev(scales["w2"].get("block")), f32(ckpt.b13), f32(ckpt.b2),
            f32(a1_scale), f32(a2_scale),
        )

    def forward(self, prepared: Prepared, hidden_states, topk_weights, topk_ids) -> torch.Tensor:
        check_moe_inputs(hidden_states.cpu(), prepared.ckpt, topk_weights.cpu(), topk_ids.cpu())
        dev = self.device
        return self.launch(prepared, hidden_states.to(dev).contiguous(), topk_weights.to(dev).float().contiguous(),
                           topk_ids.to(dev).contiguous())

    def launch(self, prepared: Prepared, x, topk_weights, topk_ids) -> torch.Tensor:
        """The forward on checked device inputs (x bf16 [T, H] contiguous, weights fp32, ids on the
        device): no host synchronisation and no host reads of device data, so it can be captured in a
        CUDA graph (the benchmarks time graph replays)."""
        ckpt = prepared.ckpt
        dev = x.device
        t, h = x.shape
        k = topk_ids.shape[1]
        if t == 0:
            return torch.empty(0, h, dtype=torch.bfloat16, device=dev)
        isz = ckpt.intermediate_size
        p = t * k
        wq = ckpt.scheme.weight
        aq, fp8_fmt = ckpt.scheme.act, ckpt.fp8_format
        tiles = self.resolve_tiles(self.tile_config(p, *scheme_kinds(ckpt.scheme)), prepared, p, dev)
        # NVFP4 W4A4: the routing launch also quantizes GEMM1's input (at decode), GEMM1's epilogue GEMM2's;
        # both store nvfp4_quantize_kernel's values
        fold_nvfp4 = self.fold_epilogues and aq is not None and aq.kind is NVFP4 and not tiles.get("quant_launch")
        a1 = torch.empty(t, h, dtype=torch.bfloat16, device=dev) if fold_nvfp4 and p <= FUSED_ALIGN_MAX_PAIRS else None
        tail_m = tiles.get("tail_m") or 0
        inline = bool(tail_m and tiles.get("inline_tails"))
        if (tiles.get("tail_warps") or tiles.get("tail_block_n")) and (not tail_m or inline):
            raise ValueError(f"tail_warps and tail_block_n set the tail launch of tail_m's blocks: they need tail_m "
                             f"without inline_tails, got tail_m {tail_m}, inline_tails {int(inline)}")
        if tail_m:
            if tail_m >= tiles["block_m"] or tiles["block_m"] % tail_m or tail_m < 16:
                raise ValueError(f"tail_m must be at least 16, below block_m and divide it; got tail_m {tail_m}, "
                                 f"block_m {tiles['block_m']}")
            if tiles.get("warp_spec") and tail_m < 128:  # (_check_warp_spec's rule, before the first launch)
                raise ValueError(f"warp_spec splits a tile's rows between two consumer warpgroups of 64-row MMAs: "
                                 f"tail_m (and block_m) at least 128, got tail_m {tail_m}")
            if inline and (tiles["block_m"] != 2 * tail_m or tiles.get("tma") == 1 or tiles.get("warp_spec") or
                           tiles.get("persistent") and not tiles.get("gluon_bf16")):
                raise ValueError(f"inline_tails takes tail_m = block_m / 2 (got tail_m {tail_m}, block_m "
                                 f"{tiles['block_m']}), activations by pointers (not tma 1), neither warp_spec nor "
                                 "a persistent grid (but gluon_bf16's)")
        # (sorted rows, block experts, short flags, tiles) of each launch of a GEMM: one, or the big blocks then the
        # tails (tail_m), or the short blocks inline
        if p > FUSED_ALIGN_MAX_PAIRS:  # prefill: three launches lay the blocks out (align_layouts)
            layouts = (align_layouts_torch if PREFILL_ALIGN_TORCH else align_layouts)(
                topk_ids, ckpt.num_experts, tiles["block_m"], tail_m, inline)
        else:
            sorted_rows, block_expert = self._align(topk_ids, ckpt.num_experts, tail_m or tiles["block_m"],
                                                    nvfp4=None if a1 is None else (x.contiguous(),
                                                                                   prepared.a1_scale, a1),
                                                    pdl=bool(tiles.get("pdl")))
            if tail_m and inline:  # one launch: each expert's short block after its full ones
                layouts = [inline_tail_blocks(sorted_rows, block_expert, tail_m, ckpt.num_experts, p)]
            elif tail_m:
                big, tail = split_tail_blocks(sorted_rows, block_expert, tail_m, tiles["block_m"], ckpt.num_experts, p)
                layouts = [(*big, None), (*tail, None)]
            else:
                layouts = [(sorted_rows, block_expert, None)]
        tail_tiles = {**tiles, "block_m": tail_m}
        if tiles.get("tail_warps"):
            tail_tiles["num_warps"] = tiles["tail_warps"]
        if tiles.get("tail_block_n"):
            tail_tiles.update(block_n=tiles["tail_block_n"], w2_block_n=tiles["tail_block_n"])
        launches = [(*layout, tiles if i == 0 else tail_tiles) for i, layout in enumerate(layouts)]
        if a1 is None:
            a1, a1_mode, a1_scale = self._quantize_activation(x, prepared.a1_scale, aq, fp8_fmt)
        else:
            a1_mode, a1_scale = 1, prepared.a1_scale.reshape(1)
        y = torch.empty(p, isz, dtype=torch.bfloat16, device=dev)
        quantized = [self._gemm(prepared, "w13", a1, a1_mode, a1_scale, y, rows, experts, topk_ids, a_row_div=k,
                                n_out=isz, k_dim=h, apply_act=True, tiles=launch_tiles,
                                quantize_nvfp4=prepared.a2_scale if fold_nvfp4 else None, tail=i > 0,
                                block_short=short)
                     for i, (rows, experts, short, launch_tiles) in enumerate(launches)]
        if all(quantized):
            a2, a2_mode, a2_scale = y, 1, prepared.a2_scale.reshape(1)
        else:
            a2, a2_mode, a2_scale = self._quantize_activation(y, prepared.a2_scale, aq, fp8_fmt)
        z = torch.empty(p, h, dtype=torch.bfloat16, device=dev)
        out = torch.empty(t, h, dtype=torch.bfloat16, device=dev)
        summed = [self._gemm(prepared, "w2", a2, a2_mode, a2_scale, z, rows, experts, topk_ids, a_row_div=1,
                             n_out=h, k_dim=isz, apply_act=False, tiles=launch_tiles, tail=i > 0,
                             topk_sum=(topk_weights, out) if self.fold_epilogues and len(launches) == 1 else None,
                             block_short=short)
                  for i, (rows, experts, short, launch_tiles) in enumerate(launches)]
        if not all(summed):
            bh = topk_reduce_block_h(t, h, multiprocessors(dev))
            K.topk_reduce_kernel[(t, triton_cdiv(h, bh))](z, topk_weights, out, h, **SEPARATE_ROUNDINGS, TOP_K=k,
                                                         BLOCK_H=bh)
        return out

    # ---- quantizer entry points (checked bit-exactly by the conformance suite) -------------------
    def quantize_mx(self, x, elem, scale_mode):
        if scale_mode not in (ScaleMode.FLOOR, ScaleMode.RCEIL):
            raise NotImplementedError(f"only FLOOR and RCEIL scales, not {scale_mode}")
        codes, scales, _ = self._mx(x.to(self.device).float().contiguous(), elem, scale_mode, values=False)
        return codes, scales

    def quantize_nvfp4(self, x, global_decode_scale):
        xf = x.to(self.device).float().contiguous()
        if not bool(torch.isfinite(xf).all()):
            raise ValueError("x must be finite for NVFP4")
        codes, scales, _ = self._nvfp4(xf, global_decode_scale, values=False)
        return codes, scales

    def quantize_fp8(self, x, fmt, granularity, block_shape, scale):
        if scale is not None:  # static: one tensor scale
            if granularity is not Granularity.PER_TENSOR:
                raise NotImplementedError("static FP8 scales are per-tensor only")
            s = torch.as_tensor(scale, dtype=torch.float32)
            codes, _, _ = self._fp8(x.to(self.device).float().contiguous(), fmt, s, x.shape[-1], values=False)
            return codes, s.reshape(1, 1)
        if granularity is Granularity.PER_TOKEN:
            group = x.shape[-1]
        elif granularity is Granularity.PER_BLOCK and block_shape[0] == 1:
            group = block_shape[1]
        else:
            raise NotImplementedError(f"{granularity} {block_shape}")
        codes, s, _ = self._fp8(x.to(self.device).float().contiguous(), fmt, scale, group, values=False)
        return codes, s

    # ---- launches --------------------------------------------------------------------------------
    @staticmethod
    def _block_buffers(x2, block: int, values: bool):
        """codes, block-scale codes and (if asked) bf16 values for a [rows, cols] quantization."""
        r, c = x2.shape
        if c % block:
            raise ValueError(f"x's last dim must be divisible by {block}, got {c}")
        codes = torch.empty(r, c, dtype=torch.uint8, device=x2.device)
        scales = torch.empty(r, c // block, dtype=torch.uint8, device=x2.device)
        vals = torch.empty(r, c, dtype=torch.bfloat16, device=x2.device) if values else codes
        return r, c, codes, scales, vals

    def _mx(self, x2, elem, scale_mode, values: bool):
        r, c, codes, scales, vals = self._block_buffers(x2, 32, values)
        bm = 16
        K.mx_quantize_kernel[(triton_cdiv(r, bm), c // 32)](
            x2, codes, scales, vals, r, c, 1.0 / elem.max_normal, RCEIL=scale_mode is ScaleMode.RCEIL,
            WRITE_VALUES=values, BLOCK_M=bm, **_fmt_args(elem))
        return codes, scales, vals

    def _nvfp4(self, x2, s_dec, values: bool):
        r, c, codes, scales, vals = self._block_buffers(x2, 16, values)
        s = torch.as_tensor(s_dec, dtype=torch.float32).reshape(1).to(x2.device)
        bm = 16
        K.nvfp4_quantize_kernel[(triton_cdiv(r, bm), c // 16)](x2, codes, scales, vals, s, r, c,
                                                               WRITE_VALUES=values, BLOCK_M=bm)
        return codes, scales, vals

    def _fp8(self, x2, fmt, scale, group: int, values: bool):
        r, c = x2.shape
        codes = torch.empty(r, c, dtype=torch.uint8, device=x2.device)
        vals = torch.empty(r, c, dtype=torch.bfloat16, device=x2.device) if values else codes
        dynamic = scale is None
        if dynamic:
            if c % group:
                raise ValueError(f"x's last dim {c} is not a multiple of the FP8 group {group}")
            n_groups, group_size = c // group, group
            s = torch.empty(r, n_groups, dtype=torch.float32, device=x2.device)
            tile = triton.next_power_of_2(group)  # columns of the tile past the group are masked
        else:
            s = torch.as_tensor(scale, dtype=torch.float32).reshape(1).to(x2.device)
            tile = group_size = 128
            n_groups = 1
        fmax = fmt.max_normal
        min_scale = torch.tensor(1.0 / (fmax * 512.0), dtype=torch.float32).item()
        bm = 16
        grid_cols = n_groups if dynamic else triton_cdiv(c, group_size)
        K.fp8_quantize_kernel[(triton_cdiv(r, bm), grid_cols)](
            x2, codes, s, vals, r, c, n_groups, group_size, fmax, min_scale, FNUZ=fmt.specials.name == "FNUZ",
            DYNAMIC=dynamic, GROUP=tile, WRITE_VALUES=values, BLOCK_M=bm, **_fmt_args(fmt))
        return codes, (s if dynamic else s.reshape(()).expand(r, 1)), vals

    def _quantize_activation(self, x2, static_scale, ckpt_aq, fmt: FloatFormat):
        """GEMM operand values (exact in bf16), the A_SCALE mode and its scale tensor."""
        if ckpt_aq is None:
            return x2, 0, x2  # the scale pointer is unused in mode 0
        # the quantizer kernels upcast what they load to fp32 (exact from bf16): no fp32 copy of the activations
        # (at 8192 gpt-oss tokens the two copies moved ~0.7 GB, and the quantizers read twice the bytes)
        return _ACTIVATION_QUANTIZERS[ckpt_aq.kind](self, x2.contiguous(), static_scale, ckpt_aq, fmt)

    def _mx_activation(self, x2, static_scale, aq, fmt):
        _, _, v = self._mx(x2, aq.elem, ScaleMode.FLOOR, values=True)
        return v, 0, v

    def _nvfp4_activation(self, x2, static_scale, aq, fmt):
        return self._nvfp4_values(x2, static_scale), 1, static_scale.reshape(1)

    def _nvfp4_values(self, x2, s_dec):
        """_nvfp4's values alone (a GEMM's NVFP4 activations), bit for bit, in programs of 32 rows x 128 columns:
        at prefill the activations then stream (on an H100, gpt-oss-120b's 8192 x 2880 in 48.3 us, where 16 x 16
        programs that also stored codes and scales took 100.4: results/gpu-issue28/run-38)."""
        r, c = x2.shape
        if c % 16:
            raise ValueError(f"x's last dim must be divisible by 16, got {c}")
        vals = torch.empty(r, c, dtype=torch.bfloat16, device=x2.device)
        s = torch.as_tensor(s_dec, dtype=torch.float32).reshape(1).to(x2.device)
        bm, bc = 32, min(128, triton.next_power_of_2(c))
        K.nvfp4_quantize_kernel[(triton_cdiv(r, bm), triton_cdiv(c, bc))](x2, vals, vals, vals, s, r, c,
                                                                         WRITE_VALUES=True, BLOCK_M=bm, BLOCK_C=bc,
                                                                         WRITE_CODES=False)
        return vals

    def _fp8_activation(self, x2, static_scale, aq, fmt):
        if aq.static:
            _, _, v = self._fp8(x2, fmt, static_scale, x2.shape[1], values=True)
            return v, 1, static_scale.reshape(1)
        group = aq.block_shape[1]
        if aq.block_shape[0] != 1 or group != 128:
            raise NotImplementedError(f"dynamic FP8 activation groups other than 1x128: {aq.block_shape}")
        _, s, v = self._fp8(x2, fmt, None, group, values=True)
        return v, 2, s

    def _align(self, topk_ids, num_experts, bm: int, nvfp4=None, pdl: bool = False):
        """Pairs (token, k) sorted by expert, each expert's run padded to BLOCK_M with the sentinel P, and each
        block's expert (-1 for unused blocks). Sized for the worst case (sum over experts of ceil(count /
        BLOCK_M) <= ceil(P / BLOCK_M) + min(E, P) blocks) so that nothing is read back to the host. Up to
        FUSED_ALIGN_MAX_PAIRS pairs one Triton program does it (moe_align_kernel: at decode the dozen torch
        launches of _align_torch cost more than the GEMMs' weight streaming at one token); above, torch.
        nvfp4=(x, tensor scale, out) (up to FUSED_ALIGN_MAX_PAIRS pairs): the same launch stores x's NVFP4
        activation values into out, nvfp4_quantize_kernel's bit for bit. pdl: the kernel lets GEMM1, launched as its
        programmatic dependent, start at once (triton_kernels.PDL_ORDER)."""
        flat = topk_ids.reshape(-1)
        p = flat.numel()
        if p > FUSED_ALIGN_MAX_PAIRS:
            if nvfp4 is not None:
                raise ValueError(f"the NVFP4 quantization rides on the one-program routing: at most "
                                 f"{FUSED_ALIGN_MAX_PAIRS} pairs, got {p}")
            return align_layouts(topk_ids, num_experts, bm)[0][:2]
        dev = flat.device
        max_blocks = triton_cdiv(p, bm) + min(num_experts, p)
        sorted_rows = torch.empty(max_blocks * bm, dtype=torch.int32, device=dev)
        block_expert = torch.empty(max_blocks, dtype=torch.int32, device=dev)
        block_e = triton.next_power_of_2(num_experts)
        scratch = torch.empty(block_e, dtype=torch.int32, device=dev)
        quant = {}
        if nvfp4 is not None:
            x, s_dec, values = nvfp4
            if x.shape[1] % 16:
                raise ValueError(f"x's last dim must be divisible by 16, got {x.shape[1]}")
            quant = dict(x_ptr=x, values_ptr=values, s_dec_ptr=s_dec.reshape(1).to(torch.float32), x_rows=x.shape[0],
                         x_cols=x.shape[1], QUANT_NVFP4=True)
        programs = 1 + (triton_cdiv(quant["x_rows"], 16) * quant["x_cols"] // 16 if quant else 0)
        K.moe_align_kernel[(programs,)](flat.contiguous(), scratch, sorted_rows, block_expert, p, max_blocks,
                                        BLOCK_M=bm, BLOCK_P=max(16, triton.next_power_of_2(p)), BLOCK_E=block_e,
                                        CHUNK=16, num_warps=4, **FUSED_ALIGN_STEPS, **quant,
                                        **(dict(PDL=True) if pdl else {}))
        return sorted_rows, block_expert

    def _partials_kernel(self, prep, which, a_mode, tiles, quantize_nvfp4, n_out, n_rows, k_dim):
        """A kernel for this GEMM's fp32 partial sums ([split_k, pairs, 2, n_out], finished by the split-K
        epilogues), or with .direct its outputs, as a callable (a, partials, sorted_rows, block_expert, n_pairs,
        a_row_div, n_out, n_rows, k_dim, gated, split_k, direct=epilogue operands); None: moe_gemm_kernel. Here the
        tiles' gluon_bf16: bf16 weights and activations through gluon_kernels.bf16_prefill_kernel."""
        if not tiles.get("gluon_bf16"):
            return None
        ckpt = prep.ckpt
        gated = which == "w13" and ckpt.activation.gated
        block_n = tiles.get(f"{which}_block_n") or tiles["block_n"]
        wide = (BF16_GATED_OUTPUTS if gated else BF16_UNGATED_OUTPUTS).value
        problems = [why for bad, why in (
            (K.INTERPRET, "a compiled kernel (Triton has no Gluon interpreter)"),
            (self.device != "cpu" and detect_platform().name != "sm90", "Hopper's wgmma and TMA (sm90)"),
            (ckpt.scheme.weight is not None or ckpt.scheme.act is not None or a_mode != 0
             or quantize_nvfp4 is not None, "bf16 weights and activations"),
            ((tiles.get("split_k") or 1) != 1, "the whole K an item (no split_k)"),
            (tiles.get("tail_m") and not (tiles.get("inline_tails") and tiles["tail_m"] * 2 == tiles["block_m"] == 128),
             "tails inline at half a 128-pair block (tail_m 64, inline_tails 1), or none"),
            (block_n != wide, f"{wide} outputs a program ({which}'s block_n {block_n})"),
            (tiles["block_m"] not in (64, 128), f"block_m 64 or 128 (got {tiles['block_m']})"),
            (k_dim % 16, f"K a multiple of 16: the activations' 16-byte cp.async runs aligned (got {k_dim})")) if bad]
        if problems:
            raise ValueError(f"gluon_bf16 ({which}) needs " + "; ".join(problems))
        from .gluon_kernels import launch_bf16_prefill

        w = getattr(prep, which)
        stages, maxnreg, bm = tiles["num_stages"], tiles.get("maxnreg") or 168, tiles["block_m"]

        def run(a, partials, sorted_rows, block_expert, n_pairs, a_row_div, n_out, n_rows, k_dim, gated, split_k,
                serial=None, ids=None, direct=None, block_short=None):
            if a.data_ptr() % 16 or a.stride() != (k_dim, 1):  # cp.async moves 16-byte runs of whole rows
                a = a.clone(memory_format=torch.contiguous_format)
            # persistent: that many programs a multiprocessor (one fits: 192-224 KB of ring and epilogue scratch)
            programs = tiles["persistent"] * multiprocessors(a.device) if tiles.get("persistent") else 0
            return launch_bf16_prefill(K.bf16_prefill_kernel, w, a, sorted_rows, block_expert, n_pairs, a_row_div,
                                       n_out, n_rows, k_dim, gated, ckpt.activation.interleaved, direct, stages, bm,
                                       maxnreg, tiles.get("group_m") or 0, programs, block_short)
        run.direct = True  # the outputs from the accumulators: no partial sums, no epilogue launch after
        run.inline_tails = True  # inline_tail_blocks' short blocks at half the rows (the kernel's INLINE)
        return run

    @staticmethod
    def _align_torch(topk_ids, num_experts, bm: int):
        """_align in torch ops (any number of pairs; the oracle of moe_align_kernel in suites/test_triton_helpers.py)."""
        flat = topk_ids.reshape(-1).long()
        p = flat.numel()
        dev = flat.device
        max_blocks = triton_cdiv(p, bm) + min(num_experts, p)
        order = torch.argsort(flat, stable=True)
        counts = torch.zeros(num_experts, dtype=torch.long, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
        blocks = (counts + bm - 1) // bm
        block_end = torch.cumsum(blocks, 0)  # blocks of experts 0..e
        first = torch.cumsum(counts, 0) - counts
        expert_sorted = flat[order]
        rank = torch.arange(p, device=dev) - first[expert_sorted]
        sorted_rows = torch.full((max_blocks * bm,), p, dtype=torch.int32, device=dev)
        sorted_rows[(block_end - blocks)[expert_sorted] * bm + rank] = order.to(torch.int32)
        b = torch.arange(max_blocks, device=dev)
        block_expert = torch.searchsorted(block_end, b, right=True).to(torch.int32)
        block_expert = torch.where(b < block_end[-1], block_expert, -1)
        return sorted_rows, block_expert

    def _gemm(self, prep: Prepared, which: str, a, a_mode, a_scale, out, sorted_rows, block_expert, topk_ids,
              a_row_div, n_out, k_dim, apply_act, tiles, topk_sum=None, quantize_nvfp4=None, tail=False,
              block_short=None) -> bool:
        """One grouped GEMM into `out`; its epilogue may do the next step too (True returned):
        quantize_nvfp4=tensor scale (GEMM1): out holds the next GEMM's NVFP4 activation values;
        topk_sum=(topk_weights, out_tokens) (GEMM2, split-K): the top-k sum into out_tokens (out untouched).
        tail: the launch of the tail blocks (tiles' tail_m), recorded under "w13_tail" / "w2_tail".
        block_short: inline_tail_blocks' flags (tiles' inline_tails): the short blocks at tail_m rows."""
        ckpt = prep.ckpt
        wq = ckpt.scheme.weight
        act = ckpt.activation
        w = getattr(prep, which)
        ws = getattr(prep, f"{which}_scale")
        expert_scale = getattr(prep, f"{which}_expert_scale")
        block_scale = getattr(prep, f"{which}_block_scale")
        bias = prep.b13 if which == "w13" else prep.b2
        n_rows = (2 * n_out if act.gated else n_out) if which == "w13" else n_out
        n_pairs = topk_ids.numel()
        elem = None if wq is None else wq.kind.code_format(wq, ckpt.fp8_format)
        dummy = out
        block_n = tiles.get(f"{which}_block_n") or tiles["block_n"]
        launch_options = dict(SEPARATE_ROUNDINGS, **({"maxnreg": tiles["maxnreg"]} if tiles.get("maxnreg") else {}))
        if tiles.get("mma_steps"):
            launch_options["MMA_STEPS"] = tiles["mma_steps"]
        if tiles.get("scale_regs") and prep.constexprs.get("BITPLACE"):
            if (tiles.get("mma_steps") or 1) != 1:
                raise ValueError(f"scale_regs 1 takes mma_steps 1 (one K step a 128-value chunk, whose scales it "
                                 f"loads a step ahead), got mma_steps {tiles['mma_steps']}")
            launch_options["SCALE_REGS"] = True
        if tiles.get("group_m"):
            launch_options["GROUP_M"] = tiles["group_m"]
        # split-K (the bit-placement loop only): fp32 partial sums of each K range, then one epilogue kernel
        split_k = tiles.get("split_k") or 1 if prep.constexprs.get("BITPLACE") else 1
        quantize = quantize_nvfp4 is not None and apply_act
        q_scale = quantize_nvfp4.reshape(1) if quantize else out
        target = out
        partials = self._partials_kernel(prep, which, a_mode, tiles, quantize_nvfp4, n_out, n_rows, k_dim)
        # a subclass's kernel that finishes its tiles from the accumulators (the epilogue's operands, no partial sums)
        direct = bool(getattr(partials, "direct", False))
        if split_k > 1 or partials and not direct:
            launch_options["SPLIT_K"] = split_k
            target = torch.empty(split_k, n_pairs, 2, n_out, dtype=torch.float32, device=out.device)
        # the split-K epilogue in the GEMM's launch (SERIAL_K; a partial-sums kernel's SERIAL) where
        # splitk_epilogue_kernel would run
        serial = bool(tiles.get("serial_k")) and (split_k > 1 or bool(partials)) and (topk_sum is None or apply_act)
        a_arg, w_arg = a, w
        bitplace = bool(prep.constexprs.get("BITPLACE"))
        gated = bool(apply_act and act.gated)
        if tiles.get("tma") and not partials and not self.use_dot_scaled and k_dim % 8 == 0:
            # TMA boxes need 16-byte row strides (K % 8 bf16); the bit-placement loop reads 128 / mma_steps columns
            if bitplace and tiles["block_m"] > 64 and tiles["tma"] == 1:
                # compiled for sm90 by Triton 3.6 this races on the H200: at 128 rows, 3 stages, 4 warps and 64
                # columns GEMM2's ungated loop gave 2-7% of the outputs wrong, a different count each run, on every
                # shape tried (results/gpu-issue28/run-22, tma128_bisect.py; run-23, tma128_race.py); GEMM1's gated
                # loop, and 1, 2 or 4 stages, 8 warps, 128 columns or mma_steps 2, ran bit for bit with pointer loads.
                # The interpreter gives the same bits: the compiled pipeline's, not the kernel's logic. Refused for
                # every 128-row tile rather than for the one configuration caught.
                raise ValueError(f"tma 1 with the bit-placement loop takes block_m <= 64, got {tiles['block_m']}: at "
                                 "128 rows its TMA activations race in Triton 3.6's compiled pipeline on the H200 "
                                 "(results/gpu-issue28/run-23)")
            w_tma = not bitplace and wq is None and a_mode != 2 and block_scale is None
            warp_spec = bool(tiles.get("warp_spec"))
            if warp_spec:
                # Triton's own warp specialization of the bf16 TMA loop (sm90: a producer warpgroup issuing the TMA
                # loads, the num_warps consumer warps doubled into two warpgroups that split the tile's rows)
                _check_warp_spec(tiles, w_tma, bitplace, wq, gated and act.interleaved, k_dim)
            if (bitplace or w_tma) and tiles["tma"] == 1:  # 2: the weights only, the activations by pointers
                box_k = 128 // (tiles.get("mma_steps") or 1) if bitplace else tiles["block_k"]
                gathered = gather_block_rows(a, sorted_rows, n_pairs, a_row_div)
                a_arg = gathered if warp_spec else TensorDescriptor.from_tensor(gathered, [tiles["block_m"], box_k])
                launch_options["A_TMA"] = True
            if w_tma and warp_spec:  # the kernel makes both descriptors (_k_loop_tma's WARP_SPEC)
                use_device_tensor_descriptors()
                pairs = gated and act.interleaved  # row pairs: gate row n's K values, then up row n's, one row of 2 K
                launch_options.update(W_TMA=True, WARP_SPEC=int(tiles["warp_spec"]), a_desc_rows=gathered.shape[0],
                                      w_desc_rows=w.numel() // (2 * k_dim if pairs else k_dim))
            elif w_tma:
                rows = 2 * block_n if gated and act.interleaved else block_n
                w_arg = TensorDescriptor.from_tensor(w.view(-1, k_dim), [rows, tiles["block_k"]])
                launch_options["W_TMA"] = True
        elif tiles.get("warp_spec"):
            _check_warp_spec(tiles, False, bitplace, wq, False, k_dim)
        grid = (block_expert.numel(), triton_cdiv(n_out, block_n), split_k)
        if tiles.get("persistent") and split_k == 1 and not partials:
            # persistent programs (tiles' persistent: that many a multiprocessor) over the used blocks' tiles, their
            # number counted on the device (the blocks past them have expert -1: _align, split_tail_blocks)
            launch_options["PERSISTENT"] = True
            launch_options["used_blocks_ptr"] = (block_expert >= 0).sum(dtype=torch.int32).reshape(1)
            grid = (min(tiles["persistent"] * multiprocessors(out.device), grid[0] * grid[1]),)
        common = dict(A_SCALE=a_mode, HAS_EXPERT_SCALE=expert_scale is not None, HAS_BIAS=bias is not None,
                      GATED=gated, INTERLEAVED=act.interleaved, ACT=_ACT_IDS[act.formula],
                      APPLY_ACT=apply_act, HAS_LIMIT=act.limit is not None)
        scalars = (float(act.alpha), float(act.beta), float(act.beta_lin), float(act.limit or 0.0))
        if block_short is not None:
            launch_options.update(TAIL_M=tiles["tail_m"], block_short_ptr=block_short)
        if tiles.get("tail_m") and (split_k > 1 or partials and not (block_short is not None and direct
                                                                     and getattr(partials, "inline_tails", False))):
            # their epilogues run over every pair of the GEMM (a direct kernel that takes the short blocks: its own)
            raise ValueError(f"tail_m {tiles['tail_m']} (a GEMM in two launches) with split_k {split_k} or a "
                             "partial-sums kernel: the split-K epilogue would read the other launch's pairs unwritten")
        if serial and not partials:
            launch_options.update(SERIAL_K=True, count_ptr=self._tile_count_buffer(out.device, grid[0] * grid[1]),
                                  final_ptr=out)
        key = which + "_tail" if tail else which
        self.last_launch[key] = (grid, tiles)
        if partials:  # a subclass's own kernel writes the fp32 partial sums (or, direct, the outputs); the epilogue
            # is moe_gemm_kernel's, with these operands
            epilogue = dict(
                final_ptr=out, a_scale_ptr=a_scale if a_mode else dummy,
                expert_scale_ptr=expert_scale if expert_scale is not None else dummy,
                bias_ptr=bias if bias is not None else dummy, q_scale_ptr=q_scale, alpha=scalars[0], beta=scalars[1],
                beta_lin=scalars[2], limit=scalars[3], QUANT_NVFP4=quantize,
                **{k: common[k] for k in ("A_SCALE", "HAS_EXPERT_SCALE", "HAS_BIAS", "INTERLEAVED", "ACT", "APPLY_ACT",
                                          "HAS_LIMIT")})
            if serial:
                epilogue["count_ptr"] = self._tile_count_buffer(out.device,
                                                                block_expert.numel() * triton_cdiv(n_out, 64))
            self.last_compiled[key] = partials(a, target, sorted_rows, block_expert, n_pairs, a_row_div, n_out,
                                                 n_rows, k_dim, bool(apply_act and act.gated), split_k,
                                                 ids=topk_ids.reshape(-1),
                                                 **({"serial": epilogue} if serial else {}),
                                                 **({"direct": epilogue} if direct else {}),
                                                 **({"block_short": block_short} if block_short is not None else {}))
        else:
            self.last_compiled[key] = K.moe_gemm_kernel[grid](
                a_arg, a_scale if a_mode else dummy, w_arg, ws if ws is not None else dummy,
                block_scale if block_scale is not None else dummy, expert_scale if expert_scale is not None else dummy,
                bias if bias is not None else dummy, target, sorted_rows, block_expert, n_pairs, a_row_div, n_out, n_rows,
                k_dim, *scalars, q_scale, QUANT_NVFP4=quantize and (split_k == 1 or serial),
                W_KIND=_W_KIND[None if wq is None else wq.kind],
                PACKED=bool(elem is not None and elem.nbits == 4), EBITS=elem.ebits if elem else 0,
                MBITS=elem.mbits if elem else 0, BIAS=elem.bias if elem else 0, W_BLOCK_SCALE=block_scale is not None,
                BLOCK_M=tiles["block_m"], BLOCK_N=block_n, BLOCK_K=tiles["block_k"], INTERPRET_DOT=K.INTERPRET,
                DOT_SCALED=self.use_dot_scaled, DS_FMT=self.dot_scaled_format(elem) if self.use_dot_scaled else "e2m1",
                num_warps=tiles["num_warps"], num_stages=tiles["num_stages"], **common, **launch_options,
                **prep.constexprs,
            )
        if split_k == 1 and not partials or serial or direct:
            return quantize
        operands = (a_scale if a_mode else dummy, expert_scale if expert_scale is not None else dummy,
                    bias if bias is not None else dummy)
        # programmatic dependents (triton_kernels.PDL_ORDER): each waits in the kernel for its predecessor
        epilogue_options = dict(SEPARATE_ROUNDINGS, **(dict(PDL=True, launch_pdl=True) if tiles.get("pdl") else {}))
        if topk_sum is not None and not apply_act:  # one launch fewer at decode (issue 28)
            weights, out_tokens = topk_sum
            K.splitk_topk_reduce_kernel[(out_tokens.shape[0], triton_cdiv(n_out, TOPK_BLOCK_H))](
                target, topk_ids.reshape(-1), weights, *operands, out_tokens, n_pairs, n_out, n_rows,
                SPLIT_K=split_k, TOP_K=topk_ids.shape[1], A_SCALE=a_mode, HAS_EXPERT_SCALE=expert_scale is not None,
                HAS_BIAS=bias is not None, BLOCK_H=TOPK_BLOCK_H, **epilogue_options)
            return True
        # pairs a program: the call's pairs up to 16 (EPILOGUE_FIT_PAIRS)
        bp, bn = min(16, triton.next_power_of_2(n_pairs)) if EPILOGUE_FIT_PAIRS else 16, 64
        K.splitk_epilogue_kernel[(triton_cdiv(n_pairs, bp), triton_cdiv(n_out, bn))](
            target, topk_ids.reshape(-1), *operands, out, n_pairs, n_out, n_rows, *scalars, SPLIT_K=split_k,
            BLOCK_P=bp, BLOCK_N=bn, q_scale_ptr=q_scale, QUANT_NVFP4=quantize, **common, **epilogue_options)
        return quantize


    def _tile_count_buffer(self, dev, tiles: int) -> torch.Tensor:
        """SERIAL_K's arrival counts, one int32 a tile, zero between launches (each tile's last program resets its
        own), kept across calls so that a captured CUDA graph launches no memset. Grown by a new buffer of zeros
        when too small; the old ones stay alive, since a graph captured before may still count in them."""
        held = self._tile_counts.setdefault(dev, [])
        if not held or held[-1].numel() < tiles:
            held.append(torch.zeros(max(tiles, 2 * held[-1].numel() if held else 1024), dtype=torch.int32,
                                    device=dev))
        return held[-1]


TOPK_BLOCK_H = 128  # columns of the top-k sum per program (decode)
TOPK_WIDE_BLOCK_H = 1024  # ... where the tokens fill the GPU (topk_reduce_block_h)


def topk_reduce_block_h(tokens: int, h: int, sms: int) -> int:
    """Columns a program of topk_reduce_kernel: TOPK_WIDE_BLOCK_H (8 a thread of 4 warps: 16-byte loads) where the
    grid still has 4 programs a multiprocessor at that width (prefill), else TOPK_BLOCK_H. At 128 columns the sum
    moved gpt-oss-120b's 8192 tokens (236 MB) in 115.7 us on an H100, 2.0 TB/s (results/gpu-issue28/run-38): 188K
    programs of one 2-byte load a thread each. The bits are the same at any width (each column's sum, in order)."""
    return TOPK_WIDE_BLOCK_H if tokens * triton_cdiv(h, TOPK_WIDE_BLOCK_H) >= 4 * sms else TOPK_BLOCK_H
# The epilogues' products and sums rounded one by one, as the reference's (x * scale, then + bias; w * z, then the
# sum): no fused multiply-add contracted by the compiler, which would round once and differ by an fp32 ulp, and
# differ between kernels (the H200 run-9 smoke: NVFP4 with biases, moe_gemm_kernel's fused epilogue against
# splitk_epilogue_kernel's, one bf16 ulp apart). A compile option: the interpreter ignores it.
SEPARATE_ROUNDINGS = dict(enable_fp_fusion=False)

_ACTIVATION_QUANTIZERS = {MX: TritonEmulationBackend._mx_activation, NVFP4: TritonEmulationBackend._nvfp4_activation,
                          FP8: TritonEmulationBackend._fp8_activation}


def split_k_to_fill(tiles: dict, gemm1_programs: int) -> dict:
    """The tiles with split_k resolved from a table row's split_k_programs: the fewest of 1, 2, 4 splits of the K
    chunks that give GEMM1 (at most one M block per routed expert at decode) that many programs, GEMM2 the same
    splits. From the H200 sweep (results/gpu-issue28/run-2): at one token gpt-oss-120b's 180 programs ran fastest
    split 4 ways, Kimi-K2's 256 split 2 ways (4 ways was 7% slower there); from 8 tokens on, unsplit."""
    want = tiles["split_k_programs"]
    split = tiles.get("split_k") or next((s for s in (1, 2, 4) if gemm1_programs * s >= want), 4)  # a set one stays
    return {**{k: v for k, v in tiles.items() if k != "split_k_programs"}, "split_k": split}


H200_MULTIPROCESSORS = 132  # compile_check's target, where no GPU answers


def _check_warp_spec(tiles: dict, w_tma: bool, bitplace: bool, wq, pairs: bool, k_dim: int) -> None:
    """A ValueError naming warp_spec where the launch is not one Triton's sm90 warp specialization compiles: the bf16
    TMA loop with both operands by TMA (tma 1: Triton 3.6 fails on activations by pointers; K a multiple of 8, TMA's
    16-byte strides) on the plain grid (the kernel makes its descriptors there), tiles of at least 128 rows (each
    consumer warpgroup takes half; a wgmma takes 64), K a multiple of block_k where gate and up rows are read as row
    pairs (a box would straddle them)."""
    if not w_tma or tiles.get("tma") != 1:
        kind = "bit-placement" if bitplace else "dequantizing" if wq is not None else "bf16"
        raise ValueError(f"warp_spec (the K loop warp-specialized by Triton) takes the bf16 TMA loop with both "
                         f"operands by TMA: bf16 weights, tma 1, K a multiple of 8; got tma {tiles.get('tma')}, K "
                         f"{k_dim} for a {kind} GEMM")
    if tiles["warp_spec"] == 1 and tiles["num_warps"] == 4 and tiles["num_stages"] > 2:
        # compiled by Triton 3.6 for the H200 this gave wrong outputs (NaN on Kimi-K2's halves) at 3 and 4 stages and
        # none at 2 stages or 8 warps, while warp_spec 2 (the same descriptors unspecialized) ran bit for bit
        # (results/gpu-issue28/run-24): a fault of the pass's buffering, not of the kernel's logic
        raise ValueError(f"warp_spec 1 at 4 warps takes num_stages <= 2, got {tiles['num_stages']}: Triton 3.6's "
                         "warp-specialized pipeline gave wrong outputs at 3 and 4 stages on the H200 "
                         "(results/gpu-issue28/run-24)")
    if tiles.get("persistent"):
        raise ValueError(f"warp_spec takes the plain grid (one tile a program), got persistent {tiles['persistent']}")
    if tiles["block_m"] < 128:
        raise ValueError(f"warp_spec splits a tile's rows between two consumer warpgroups of 64-row MMAs: block_m "
                         f"(and tail_m) at least 128, got {tiles['block_m']}")
    if pairs and k_dim % tiles["block_k"]:
        raise ValueError(f"warp_spec reads interleaved gate and up rows as row pairs: K {k_dim} must be a multiple "
                         f"of block_k {tiles['block_k']} (a box would straddle gate and up)")


def use_device_tensor_descriptors() -> None:
    """Triton's global scratch allocator, from torch's caching allocator on the launch's device (inside a CUDA graph
    capture, its private pool), for the TMA descriptors a kernel makes on the device (tl.make_tensor_descriptor: 128
    bytes a program). Set before every such launch: Triton 3.9 keeps the allocator per thread and context."""
    if not K.INTERPRET:
        triton.set_allocator(_torch_scratch)


def _torch_scratch(size: int, alignment: int, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


def multiprocessors(dev) -> int:
    """The GPU's multiprocessors, or the H200's where the launch is not on a GPU (compile_check)."""
    dev = torch.device(dev)
    return torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else H200_MULTIPROCESSORS


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def make_backend() -> TritonEmulationBackend:
    return TritonEmulationBackend()


__all__ = ["TritonEmulationBackend", "make_backend"]
