"""A warp-specialised FP4 decode GEMM in Gluon (Triton's explicit-layout dialect) for Hopper (issue 28).

bitplace_partials_kernel computes triton_bitplace's MXFP4 (or NVFP4: W_NV) x bf16 products of one expert block (16
pairs at decode, 32-128 at prefill: BM) and 64 output rows (gate and up when gated) over a share of the K chunks, as
fp32 partial sums [SPLIT_K, pairs, 2, N_OUT] that triton_kernels.splitk_epilogue_kernel / splitk_topk_reduce_kernel
finish (bias, activation, top-k sum: the same epilogues and roundings as the split-K path of moe_gemm_kernel), or at
prefill (DIRECT) the outputs themselves through moe_gemm_kernel's epilogue. What differs from moe_gemm_kernel's loop:
- a one-warp producer partition streams each K step's codes (rows stored in pairs, triton_bitplace.pair_rows: one
  [32 row pairs, 32 words] TMA box a tile) and block scales (a transposed copy, one [1, 256]-byte box a tile)
  with TMA, and the block's activation rows with cp.async, into a STAGES-deep ring of shared memory, signalling
  an mbarrier per slot; the load addresses and copies leave the consumer warps entirely;
- the consumer warpgroup reads a slot with one 16-byte shared load per row and thread, in exactly the words the
  wgmma register operand needs (CODE_PAIRS), places the bits and multiplies each pair by its block factor with
  triton_kernels' own _place_pairs and _scaled_halves_bf16; the layout conversion to the operand is asserted
  trivial (a register relabel, checked by the compiler), and the 8 wgmma of a tile issue back to back under one
  arrive/wait (moe_gemm_kernel's compiled loop waits after every wgmma).
Compiled for sm90 with Triton 3.6: 343 SASS per K step in the consumer loop for the gated 2 x 64-row tile
(moe_gemm_kernel: 439), no spills at 80 registers a thread. On the H200 (results/gpu-issue28/run-7, run-8): bit for
bit with triton_bitplace, conformance, memcheck and synccheck clean, 10-13% faster than triton_bitplace at decode.
TILES 2 (block_n 128): two consumer warpgroups a program on one ring, 384 threads, 2 programs a multiprocessor (16
consumer warps against 12), the activation rows loaded once for both tiles; bit for bit on the H200 but 2-8% slower
from 8 tokens on (results/gpu-issue28/run-9), so a launch parameter, not the default.
NVFP4 (W_NV): a tile's 8 scale bytes a row come as one [2, 256] box; the factors (E4M3 x 2^119, exact in bf16) are
built per block by triton_kernels._nvfp4_factor_words, moe_gemm_kernel's own; 428 SASS a step for the gated
tiles against moe_gemm_kernel's 531 (Triton 3.6 for sm90); on the H200 bit for bit with triton_bitplace and 8-13%
faster than it from 8 tokens on (results/gpu-issue28/run-9, run-10): the default (MOE_CONFORMANCE_GLUON_NVFP4=0 off).
PDL (programmatic dependent launch, triton_kernels.PDL_ORDER): GEMM1 waits at entry; GEMM2 prefetches its weights
into L2 before it waits, under GEMM1's last wave (gpt-oss-120b one token 39.1 -> 36.8 us, run-9's tune-pdl), or where
they are too many for L2 waits at entry too (Kimi-K2 one token 91.3 -> 85.6 us, results/gpu-issue28/run-12).
GEMM1 at most 16 tokens may prefetch its first K chunks into L2 before its wait too (PDL 3: its block's expert ranked
from the expert ids, _block_expert_by_rank); on an H100 gpt-oss-120b one token 39.8 -> 38.8 us (results/gpu-issue28/run-33).
TILE_MAJOR: codes and scales read from a tile-major copy (tile_major_codes / tile_major_scales: a tile's K steps one
contiguous run, each step's box 4 KB in one piece); on an H100 bit for bit and 1.3-3.3% faster at every decode point
of both models (run-33): the triton_bitplace_gluon default where a GEMM's rows are whole 64-row tiles.
Quantized activations (W4A4, W4A8: exact bf16 values, their one scale applied by the epilogue kernels) run the same
kernel: on the H200 bit for bit with triton_bitplace (run-11).
PERSIST (the tiles' `persistent`, opt-in): the programs that fit at once, each running the plain grid's programs as
work items on one ring (_consumer_items / _producer_items). Bit for bit on the H200 but 5-16% slower at every decode
point (results/gpu-issue28/run-13: gpt-oss-120b 8 tokens 140.8 -> 159.6 us, Kimi-K2 64 tokens 2067.6 -> 2161.1).
SERIAL (the tiles' `serial_k`, opt-in; not persistent): after its partial sums a consumer warpgroup syncs its own
threads (a barrier of the partition: bar.sync 0 / 2, 128 in the PTX), counts its 64-row tile in (one acquire-release
atomic), and the tile's last split adds the SPLIT_K partial sums back from L2 in split order and runs
triton_kernels._epilogue into the GEMM's output, splitk_epilogue_kernel's work and operands (GEMM1's launch of it
dropped; compiled without contracted multiply-adds, as that kernel is). Compiled for sm90 by Triton 3.6 at 80
registers without spills (two warpgroups and one, split and not); on the H200 bit for bit with the epilogue
launch and no faster (results/gpu-issue28/run-22): opt-in.

bf16_prefill_kernel is the same design for bf16 weights (triton_emulation's tiles' gluon_bf16): a producer warpgroup
streams four [64, 64] weight boxes a K step by TMA (gate and up rows of each consumer's 64 outputs, interleaved rows
read as row pairs of a [E x N, 2 K] view; or, ungated, two 64-row tiles) and the block's activation rows by
cp.async; two consumer warpgroups issue wgmma with both operands in shared memory, a step's MMAs in flight while the
next step's issue, and finish with moe_gemm_kernel's epilogue from the accumulators. Compiled for sm90 by Triton 3.6
without spills (224 KB of shared memory at 128-pair blocks and 4 stages); on an H100 bit for bit with the bf16
prefill row at both models' sizes (results/gpu-issue28/run-37, run-38) and 9-36% slower at gpt-oss-120b's 8192 tokens
(run-38: 3572.4 us for the row; 3881.9 persistent without tails, 4874.6 with inline tails): opt-in.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from . import triton_kernels as K  # its tl.jit bit placement, called from Gluon (resolved when compiled)
from .triton_kernels import gdc_launch_dependents, gdc_wait
# (by its bare name: Triton keys a compiled kernel by the globals it reads by name, not through a module attribute,
# so K.HALF_SELECT would let a warm cache hand a MOE_CONFORMANCE_HALF_SELECT=0 run the other switch's binary)
from .triton_kernels import HALF_SELECT

# the loads by their Triton 3.6 names (the H200's) or the later ones (this venv's 3.9 removed the old names)
_cp_async = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
# a barrier of the calling partition's threads (Triton 3.6's thread_barrier, later releases' barrier)
_partition_barrier = getattr(gl, "thread_barrier", None) or gl.barrier

# Codes of a 64-row tile from shared memory, [32 row pairs, 32 words] (pair m holds rows 2m, 2m + 1: words 0-15,
# 16-31): thread (warp w, lane 4g + t) gets rows 16w + g and 16w + g + 8 (pair 8w + 4h + g // 2, half g % 2),
# words 4t..4t+3 of each: the wgmma register operand's rows and its 32 codes of each (mma_order_codes).
CODE_PAIRS = gl.DistributedLinearLayout(
    reg_bases=[[0, 1], [0, 2], [4, 0]], lane_bases=[[0, 4], [0, 8], [0, 16], [1, 0], [2, 0]],
    warp_bases=[[8, 0], [16, 0]], block_bases=[], shape=[32, 32])
# the same words as [64 rows, 4 thread-groups t, 4 words q]
CODE_ROWS = gl.DistributedLinearLayout(
    reg_bases=[[0, 0, 1], [0, 0, 2], [8, 0, 0]], lane_bases=[[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
    warp_bases=[[16, 0, 0], [32, 0, 0]], block_bases=[], shape=[64, 4, 4])
ACC = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 16, 16])
DOT_A = gl.DotOperandLayout(operand_index=0, parent=ACC, k_width=2)


def accumulator_layouts(bm: int):
    """(accumulator, register operand) layouts of a warpgroup's wgmma m64 n`bm` k16: 64 weight rows by bm pairs."""
    if bm == 16:
        return ACC, DOT_A
    acc = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, bm, 16])
    return acc, gl.DotOperandLayout(operand_index=0, parent=acc, k_width=2)


CODE_SMEM = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2)
SCALE_SMEM = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=2)
SCALE_ROWS = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])  # the [1, 256] box seen as [64 rows, 4 bytes]
X_SMEM = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
X_LOAD = gl.BlockedLayout([1, 8], [2, 16], [1, 1], [1, 0])  # the producer warp: [16 rows, 128] bf16, 16 B a lane
PRODUCER_WARPS = gl.constexpr(1)  # X_LOAD's warps; the ready barriers count a cp.async arrive from each thread
# TILES 2: the second consumer warpgroup's registers (a worker partition's are fixed; the default partition, the
# first consumer, gets what the launch's cap leaves: 3 maxnreg - SECOND_CONSUMER_REGS - 40 of 384 threads' worth)
SECOND_CONSUMER_REGS = gl.constexpr(104)
# _decode_tile's joined dims (warp, h, g, t, q, i2, i1, i0) to (warp, h, g, q, i2, i1, t, i0): row 16 warp + 8h + g,
# column 32q + 16 i2 + 8 i1 + 2t + i0 (suites/test_fp4_bits.py replays the steps in torch with this order)
DECODE_ORDER = gl.constexpr((0, 1, 2, 4, 5, 6, 3, 7))
BLOCK_M = 16  # pairs of one expert block (the decode tile; moe_align's blocks)
CODE_BOX = [32, 32]  # int32: 32 row pairs x one 128-value chunk (16 words a row)
SCALE_BOX = [1, 256]  # uint8: one chunk's 4 MX block-scale bytes of 64 rows
NVFP4_SCALE_BOX = [2, 256]  # uint8: one chunk's 8 NVFP4 block-scale bytes of 64 rows (a box row is at most 256)
# the NVFP4 box as [64 rows, 2 int32 words] (blocks 4w .. 4w + 3 of a row in word w), a row's words in the
# registers of the threads that hold that row's codes (CODE_ROWS' rows; the thread-group lanes t all alike)
# the MX box as [64 rows, 1 int32 word] (a row's 4 block scales), likewise in the registers of its rows' threads
MX_SCALE_WORDS = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[8, 0]], lane_bases=[[0, 0], [0, 0], [1, 0], [2, 0], [4, 0]], warp_bases=[[16, 0], [32, 0]],
    block_bases=[], shape=[64, 1]))
SCALE_WORDS = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[0, 1], [8, 0]], lane_bases=[[0, 0], [0, 0], [1, 0], [2, 0], [4, 0]], warp_bases=[[16, 0], [32, 0]],
    block_bases=[], shape=[64, 2]))


# a scale box as [64 rows, COLS] of DTYPE (MX: 4 bytes or 1 word a row; NVFP4: 2 words): Triton 3.6 names the method
# _reinterpret, later releases reinterpret
if hasattr(gl.shared_memory_descriptor, "reinterpret"):
    @gluon.jit
    def _scale_box_as(slot, DTYPE: gl.constexpr, COLS: gl.constexpr, LAYOUT: gl.constexpr, SVIEW: gl.constexpr):
        return slot.reinterpret(DTYPE, [64, COLS], SVIEW).load(LAYOUT)
else:
    @gluon.jit
    def _scale_box_as(slot, DTYPE: gl.constexpr, COLS: gl.constexpr, LAYOUT: gl.constexpr, SVIEW: gl.constexpr):
        return slot._reinterpret(DTYPE, [64, COLS], SVIEW).load(LAYOUT)


@gluon.jit
def _tile_factor_halves(slot, W_NV: gl.constexpr, SL: gl.constexpr, SVIEW: gl.constexpr):
    """The block factors of a tile's scale box two a word, not doubled (triton_kernels.HALF_SELECT): (f01, f23),
    [64 rows, 4 q] in SL, the word holding the factor of pairs 0, 1 (f01) and 2, 3 (f23) of word 4t + q in one of
    its halves, which _scaled_by_factor_halves reads through the multiply's operand selector (no byte extraction,
    no duplication). MX: a row's 4 scale bytes are one word; blocks 0, 2 as the halves of (w << 7) & 0x7F807F80,
    blocks 1, 3 of (w >> 1) & 0x7F807F80 (the exponent field of 2^(s - 1) at bits 7 and 23); block q = 2 j + i is
    half j of word i, for all four pairs. NVFP4: triton_kernels._nvfp4_factor_halves of the row's two words w:
    block 4w + 2j + i is half j of its even (i 0) or odd (i 1) word; pairs 0, 1 of word q = 2w + j are in block 2q
    (even), pairs 2, 3 in block 2q + 1 (odd), half j = q % 2."""
    if W_NV:
        even, odd = K._nvfp4_factor_halves(_scale_box_as(slot, gl.int32, 2, SCALE_WORDS, SVIEW), W_NV - 1)  # [64, 2 w]
        f01 = gl.convert_layout(gl.reshape(gl.join(even, even), [64, 4]), SL, assert_trivial=True)  # q = 2w + j
        f23 = gl.convert_layout(gl.reshape(gl.join(odd, odd), [64, 4]), SL, assert_trivial=True)
    else:
        w = _scale_box_as(slot, gl.int32, 1, MX_SCALE_WORDS, SVIEW)  # [64, 1]
        ev = (w << 7) & 0x7F807F80
        od = (w >> 1) & 0x7F807F80  # (an arithmetic shift's sign bit lands outside the mask)
        # [64, 1, 2 j, 2 i] -> q = 2j + i: word i, each j alike
        f01 = gl.convert_layout(gl.reshape(gl.join(gl.join(ev, ev), gl.join(od, od)), [64, 4]), SL,
                                assert_trivial=True)
        f23 = f01
    return f01, f23


@gluon.jit
def _scaled_by_factor_halves(p, f, MX: gl.constexpr):
    """Placed pairs p [4, 2, 8, 4 t, 4 q] times their block factors, f [4, 2, 8, 4, 4] the words of
    _tile_factor_halves broadcast over t: word q by half q % 2 of f[q] (NVFP4) or half q // 2 (MX), read in place by
    triton_kernels._scaled_halves_bf16_half (HMUL2 ... R.H0_H0 / R.H1_H1) -> (lo, hi) as p."""
    p6 = gl.reshape(p, [4, 2, 8, 4, 2, 2])  # [.., q // 2, q % 2]
    f6 = gl.reshape(f, [4, 2, 8, 4, 2, 2])
    if MX:  # the half is q // 2: to the last dim
        p6 = gl.permute(p6, (0, 1, 2, 3, 5, 4))
        f6 = gl.permute(f6, (0, 1, 2, 3, 5, 4))
    pa, pb = gl.split(p6)
    fa, fb = gl.split(f6)
    la, ha = K._scaled_halves_bf16_half(pa, fa, 0)
    lb, hb = K._scaled_halves_bf16_half(pb, fb, 1)
    lo = gl.join(la, lb)
    hi = gl.join(ha, hb)
    if MX:
        lo = gl.permute(lo, (0, 1, 2, 3, 5, 4))
        hi = gl.permute(hi, (0, 1, 2, 3, 5, 4))
    return gl.reshape(lo, [4, 2, 8, 4, 4]), gl.reshape(hi, [4, 2, 8, 4, 4])


@gluon.jit
def _tile_factors(slot, W_NV: gl.constexpr, SL: gl.constexpr, SVIEW: gl.constexpr):
    """The block factors of a tile's scale box as bf16x2 words (the factor in both halves), [64 rows, 4 q] in SL:
    (f01, f23), the factors of pairs 0, 1 and of pairs 2, 3 of word 4t + q. MX: the stored exponent field of
    2^(s - 1) placed at bit 7, one block (32 columns) for all four pairs; NVFP4 (W_NV): the E4M3 scale x 2^119
    (triton_kernels._nvfp4_factor_words; W_NV 2: every scale normal, the exponent by an integer add; 3: and the
    codes stored biased, triton_bitplace._NV_BIAS), block 2q
    (columns 32q .. + 15, i2 = 0: pairs 0, 1) and block 2q + 1."""
    if W_NV:
        words = _scale_box_as(slot, gl.int32, 2, SCALE_WORDS, SVIEW)
        d0, d1, d2, d3 = K._nvfp4_factor_words(words, W_NV - 1)  # 4w + 0..3
        f01 = gl.convert_layout(gl.reshape(gl.join(d0, d2), [64, 4]), SL, assert_trivial=True)  # q = 2w + j
        f23 = gl.convert_layout(gl.reshape(gl.join(d1, d3), [64, 4]), SL, assert_trivial=True)
    else:
        f01 = _scale_box_as(slot, gl.uint8, 4, SL, SVIEW).to(gl.int32) * 0x00800080  # 2^(s - 1) in both halves
        f23 = f01
    return f01, f23


@gluon.jit
def _decode_slot(code_slot, scale_slot, W_NV: gl.constexpr, PAIRS: gl.constexpr, SL: gl.constexpr,
                 SVIEW: gl.constexpr, DOT: gl.constexpr, ROWS3: gl.constexpr):
    """A ring slot's tile (its codes and scale box) decoded into the wgmma register operand."""
    if HALF_SELECT:
        f01, f23 = _tile_factor_halves(scale_slot, W_NV, SL, SVIEW)
        return _decode_tile(code_slot.load(PAIRS), f01, f23, DOT, ROWS3, 1 if W_NV == 0 else 2)
    f01, f23 = _tile_factors(scale_slot, W_NV, SL, SVIEW)
    return _decode_tile(code_slot.load(PAIRS), f01, f23, DOT, ROWS3)


@gluon.jit
def _decode_tile(codes, f01, f23, DOT: gl.constexpr, ROWS3: gl.constexpr, HALVES: gl.constexpr = 0):
    """codes [32 pairs, 32 words] int32 (CODE_PAIRS), f01 / f23 [64 rows, 4 q] the block factors of pairs 0, 1 and
    2, 3 of word 4t + q (_tile_factors: each doubled into both halves; HALVES 1 / 2: _tile_factor_halves' words of
    two, MX / NVFP4, read by _scaled_by_factor_halves) -> the [64, 128] bf16 weights in the wgmma register operand's layout (MX:
    value x 2^s; NVFP4: value x scale x 2^-7). Code n = 4 i0 + 2 i2 + i1 of word 4t + q is column 32q + 16 i2 +
    8 i1 + 2t + i0 (triton_bitplace's stored order)."""
    word = gl.reshape(gl.reshape(codes, [32, 2, 16]), [64, 16]).to(gl.uint32, bitcast=True)
    word = gl.convert_layout(gl.reshape(word, [64, 4, 4]), ROWS3, assert_trivial=True)
    w5 = gl.reshape(word, [4, 2, 8, 4, 4])  # (warp, h, g, t, q): row 16 warp + 8h + g, word 4t + q
    f01 = gl.reshape(gl.broadcast(gl.expand_dims(f01, 1), word)[0], [4, 2, 8, 4, 4])
    f23 = gl.reshape(gl.broadcast(gl.expand_dims(f23, 1), word)[0], [4, 2, 8, 4, 4])
    p0, p1, p2, p3 = K._place_pairs(w5)
    if HALVES:  # the factors two a word (_tile_factor_halves): 1 MX, 2 NVFP4
        lo0, hi0 = _scaled_by_factor_halves(p0, f01, HALVES == 1)
        lo1, hi1 = _scaled_by_factor_halves(p1, f01, HALVES == 1)
        lo2, hi2 = _scaled_by_factor_halves(p2, f23, HALVES == 1)
        lo3, hi3 = _scaled_by_factor_halves(p3, f23, HALVES == 1)
    else:
        lo0, hi0 = K._scaled_halves_bf16(p0, f01)
        lo1, hi1 = K._scaled_halves_bf16(p1, f01)
        lo2, hi2 = K._scaled_halves_bf16(p2, f23)
        lo3, hi3 = K._scaled_halves_bf16(p3, f23)
    w = gl.join(gl.join(gl.join(lo0, lo2), gl.join(lo1, lo3)), gl.join(gl.join(hi0, hi2), gl.join(hi1, hi3)))
    # a tuple of its items: Triton 3.6's permute takes no constexpr tuple
    w = gl.permute(w, (DECODE_ORDER[0], DECODE_ORDER[1], DECODE_ORDER[2], DECODE_ORDER[3], DECODE_ORDER[4],
                       DECODE_ORDER[5], DECODE_ORDER[6], DECODE_ORDER[7]))
    w = gl.reshape(w, [64, 128])  # row-major [64 rows, 128 columns]
    return gl.convert_layout(w, DOT, assert_trivial=True)


@gluon.jit
def _code_box_at(code_row, first_row, c, chunks, TILE_MAJOR: gl.constexpr):
    """The TMA coordinates of a 64-row tile's codes of chunk c (code_row: the expert's first row pair): pair rows
    [E N_ROWS / 2, chunks x 32 words] at [row pair, 32 c]; TILE_MAJOR (tile_major_codes) [E N_ROWS / 64 x chunks x
    32, 32 words]: the tile's chunk is the 4 KB at row 32 (tile x chunks + c)."""
    if TILE_MAJOR:
        return [((code_row + first_row // 2) // 32 * chunks + c) * 32, 0]
    else:
        return [code_row + first_row // 2, c * 32]


@gluon.jit
def _scale_box_at(chunk_row, first_row, N_ROWS, W_NV: gl.constexpr, TILE_MAJOR: gl.constexpr = 0, code_row=0,
                  c=0, chunks=0):
    """The TMA coordinates of a 64-row tile's scale box in scales_by_chunk's copy: MX [chunk row, 4 first row] of
    [E chunks, 4 N_ROWS]; NVFP4 the 512 bytes at 8 (chunk row N_ROWS + first row), as rows of 256 bytes."""
    if TILE_MAJOR:  # tile_major_scales: a tile's chunk is one 256-byte row (MX) or two (NVFP4)
        return [((code_row + first_row // 2) // 32 * chunks + c) * (2 if W_NV else 1), 0]
    elif W_NV:
        return [chunk_row * (N_ROWS // 32) + first_row // 32, 0]
    else:
        return [chunk_row, first_row * 4]


PREFETCH_ITEMS = gl.constexpr(gl.BlockedLayout([1], [32], [4], [0]))  # 128 prefetches, one a thread of 4 warps


@gluon.jit
def _prefetch_l2(at, nbytes, ok):
    """cp.async.bulk.prefetch.L2 of nbytes (a multiple of 16) at each of `at` (16-byte aligned) where ok."""
    gl.inline_asm_elementwise("{ .reg .pred p; setp.ne.s32 p, $3, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; }",
                              "=r,l,r,r", [at, nbytes, ok.to(gl.int32)], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _prefetch_program_weights(codes_ptr, scales_ptr, code_row, scale_row, g_col, c_lo, c_hi, chunks, N_ROWS,
                              TILES: gl.constexpr, PER_CHUNK: gl.constexpr, TILE_MAJOR: gl.constexpr = 0):
    """This program's codes and block scales (ungated: 64 TILES rows from g_col, chunks c_lo .. c_hi - 1) into L2,
    while the kernel before it still runs (PDL_ORDER): each row pair's chunks are one run of (c_hi - c_lo) x 128
    bytes (pair_rows), each chunk's scales of the program's rows one run of 64 TILES x PER_CHUNK bytes
    (scales_by_chunk). One prefetch a thread; chunks past the first round's threads in further rounds.
    TILE_MAJOR: each tile's codes one run of (c_hi - c_lo) x 4 KB, its scales one of (c_hi - c_lo) x 64 PER_CHUNK
    bytes (tile_major_codes / tile_major_scales)."""
    i = gl.arange(0, 128, layout=PREFETCH_ITEMS)
    if TILE_MAJOR:
        # items 2 t (codes) and 2 t + 1 (scales) of tile t; tiles within N_ROWS only, a split with no chunks none
        tile = (code_row + g_col // 2) // 32 + i // 2
        ok = (i < 2 * TILES) & (g_col + 64 * (i // 2) < N_ROWS) & (c_hi > c_lo)
        first = tile.to(gl.int64) * chunks + c_lo
        is_code = i % 2 == 0
        _prefetch_l2(gl.where(is_code, codes_ptr + first * 4096, scales_ptr + first * (64 * PER_CHUNK)),
                     gl.where(is_code, (c_hi - c_lo) * 4096, (c_hi - c_lo) * (64 * PER_CHUNK)), ok)
    else:
        CODE_ITEMS: gl.constexpr = 32 * TILES
        is_code = i < CODE_ITEMS
        # rows within N_ROWS only (two tiles a program: the last one's second may lie past it), and a split with no
        # chunks prefetches nothing (a size of 0 or below would be read as ~4 GB)
        code_ok = is_code & (g_col + 2 * i < N_ROWS) & (c_hi > c_lo)
        scale_bytes = gl.minimum(64 * TILES, N_ROWS - g_col) * PER_CHUNK  # whole 16 bytes: N_ROWS % 4 == 0
        code_at = codes_ptr + ((code_row + g_col // 2 + i).to(gl.int64) * chunks + c_lo) * 128
        c = c_lo + i - CODE_ITEMS
        scale_at = scales_ptr + ((scale_row + c).to(gl.int64) * N_ROWS + g_col) * PER_CHUNK
        _prefetch_l2(gl.where(is_code, code_at, scale_at), gl.where(is_code, (c_hi - c_lo) * 128, scale_bytes),
                     code_ok | (~is_code & (c < c_hi)))
        for c0 in range(c_lo + 128 - CODE_ITEMS, c_hi, 128):
            c = c0 + i
            _prefetch_l2(scales_ptr + ((scale_row + c).to(gl.int64) * N_ROWS + g_col) * PER_CHUNK,
                         (i & 0) + scale_bytes, c < c_hi)


# [pairs i, pairs j] compares of the call's expert ids over the default partition's warpgroup (_block_expert_by_rank)
RANK_IDS = gl.constexpr(gl.BlockedLayout([1, 1], [4, 8], [4, 1], [1, 0]))


@gluon.jit
def _block_expert_by_rank(ids_ptr, n_pairs, block, P: gl.constexpr):
    """The expert moe_align_kernel gives decode block `block` where no expert has more than 16 pairs (at most 16
    tokens: a token's top-k ids are distinct): blocks in ascending expert order, one an expert routed to, so the
    block-th smallest of the distinct ids among the call's n_pairs (at most P) expert ids; -1 past them. Read from
    the ids themselves, not from the routing launch's output, so GEMM1 can use it before its wait (PDL 3)."""
    BIG: gl.constexpr = 1 << 30  # past every expert id: the lanes past n_pairs
    i = gl.arange(0, P, layout=gl.SliceLayout(1, RANK_IDS))
    j = gl.arange(0, P, layout=gl.SliceLayout(0, RANK_IDS))
    # (evict_last marks these two loads in the PTX: compile_check's PDL rule lets GEMM1 make them before its wait)
    a = gl.load(ids_ptr + i, mask=i < n_pairs, other=BIG, eviction_policy="evict_last").to(gl.int32)
    b = gl.load(ids_ptr + j, mask=j < n_pairs, other=BIG, eviction_policy="evict_last").to(gl.int32)
    same = a[:, None] == b[None, :]
    first_j = gl.sum((same & (i[:, None] < j[None, :])).to(gl.int32), 0) == 0  # no earlier pair holds j's id
    first_i = gl.sum((same & (j[None, :] < i[:, None])).to(gl.int32), 1) == 0
    rank_i = gl.sum(((b[None, :] < a[:, None]) & first_j[None, :]).to(gl.int32), 1)  # distinct ids below i's
    return gl.max(gl.where(first_i & (rank_i == block) & (i < n_pairs), a, -1), 0)


@gluon.jit
def _producer(codes_desc, scales_desc, a_ptr, sorted_rows_ptr, n_pairs, a_row_div, K, N_OUT, code_s, scale_s, x_s,
              ready, empty, pid_m, code_row, scale_row, g_col0, c_lo, c_hi, N_ROWS, GATED: gl.constexpr,
              W_NV: gl.constexpr, STAGES: gl.constexpr, TILES: gl.constexpr, BM: gl.constexpr, XL: gl.constexpr,
              it0=0, TILE_MAJOR: gl.constexpr = 0, chunks=0):
    """One work item's K steps into the ring, its first at ring position it0 (slot it0 % STAGES; a persistent
    program's items follow one another on one ring); TILE_MAJOR: codes and scales in tile_major_codes /
    tile_major_scales' layout (each tile's K steps one contiguous run)."""
    pair = gl.load(sorted_rows_ptr + pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, XL)))
    cols = gl.arange(0, 128, layout=gl.SliceLayout(0, XL))
    x_ptrs = a_ptr + (pair // a_row_div).to(gl.int64)[:, None] * K + cols[None, :]
    row_ok = (pair < n_pairs)[:, None]  # padding rows of the block: zeros (their outputs are not stored)
    NB: gl.constexpr = 2 if GATED else 1
    for i in range(c_hi - c_lo):
        s = (it0 + i) % STAGES
        mbarrier.wait(empty.index(s), (((it0 + i) // STAGES) & 1) ^ 1)  # the first pass finds every slot free
        c = c_lo + i
        # each of the warp's 32 threads arrives once its own cp.async rows have landed (.noinc: the barrier was
        # initialised for these 32 arrivals plus expect's one; the incrementing form raises the pending count
        # above its initial value, which synccheck reports as a barrier overflow and stops the kernel)
        _cp_async(x_s.index(s), x_ptrs + c * 128, mask=row_ok & (c * 128 + cols < K)[None, :])
        async_copy.mbarrier_arrive(ready.index(s), increment_count=False)
        mbarrier.expect(ready.index(s), TILES * NB * (codes_desc.block_type.nbytes + scales_desc.block_type.nbytes))
        for j in gl.static_range(TILES):  # the activation rows once, the weights of every 64-row tile
            g_col = g_col0 + 64 * j  # past N_OUT (the second tile of the last program): rows that are not stored
            slot = (s * TILES + j) * NB
            _tma_load(codes_desc, _code_box_at(code_row, g_col, c, chunks, TILE_MAJOR), ready.index(s),
                      code_s.index(slot))
            _tma_load(scales_desc, _scale_box_at(scale_row + c, g_col, N_ROWS, W_NV, TILE_MAJOR, code_row, c, chunks),
                      ready.index(s), scale_s.index(slot))
            if GATED:
                u_col = g_col + N_OUT
                _tma_load(codes_desc, _code_box_at(code_row, u_col, c, chunks, TILE_MAJOR), ready.index(s),
                          code_s.index(slot + 1))
                _tma_load(scales_desc, _scale_box_at(scale_row + c, u_col, N_ROWS, W_NV, TILE_MAJOR, code_row, c,
                                                     chunks), ready.index(s), scale_s.index(slot + 1))


@gluon.jit
def _consumer(code_s, scale_s, x_s, ready, empty, c_lo, c_hi, out_ptr, sorted_rows_ptr, n_pairs, N_OUT, pid_m, pid_s,
              g_col, TILE: gl.constexpr, TILES: gl.constexpr, GATED: gl.constexpr, W_NV: gl.constexpr,
              STAGES: gl.constexpr, BM: gl.constexpr, ACC_L: gl.constexpr, DOT: gl.constexpr, PAIRS: gl.constexpr,
              ROWS3: gl.constexpr, SVIEW: gl.constexpr, OVERLAP: gl.constexpr, it0=0, SPLIT_K: gl.constexpr = 1,
              SERIAL: gl.constexpr = 0, count_ptr=None, block_expert_ptr=None, final_ptr=None, a_scale_ptr=None,
              expert_scale_ptr=None, bias_ptr=None, q_scale_ptr=None, N_ROWS=0, alpha=0.0, beta=0.0, beta_lin=0.0,
              limit=0.0, A_SCALE: gl.constexpr = 0, HAS_EXPERT_SCALE: gl.constexpr = False,
              HAS_BIAS: gl.constexpr = False, INTERLEAVED: gl.constexpr = False, ACT: gl.constexpr = 0,
              APPLY_ACT: gl.constexpr = False, HAS_LIMIT: gl.constexpr = False, QUANT_NVFP4: gl.constexpr = False,
              DIRECT: gl.constexpr = 0):
    """One warpgroup's 64-row tile TILE of the program's TILES (its slots of the ring, its partial sums), the work
    item's first K step at ring position it0 (schedule 0 only: 1 and 2 start at 0, never persistent).
    OVERLAP 0: the up tile's decode overlaps the gate tile's MMA, each step waits for its MMAs; 1: two tiles
    decoded before their MMAs (two independent instruction chains for the scheduler; ungated, one tile a step, the
    tiles of two steps), each step waits; 2: as 1 gated, and a step's MMAs run on during the next step's decode
    (its slot is released one step later).
    SERIAL: the tile's last split finishes it here (_serial_epilogue), not splitk_epilogue_kernel.
    DIRECT (SPLIT_K 1): the epilogue from the accumulators into final_ptr (_direct_epilogue), no partial sums."""
    NB: gl.constexpr = 2 if GATED else 1
    SL: gl.constexpr = gl.SliceLayout(1, ROWS3)
    acc_g = gl.zeros([64, BM], gl.float32, ACC_L)
    acc_u = gl.zeros([64, BM], gl.float32, ACC_L)
    n_steps = c_hi - c_lo
    PAIRED: gl.constexpr = OVERLAP * 2 + NB == 3  # schedule 1, ungated
    if PAIRED:  # two steps an iteration (the ring holds at least two slots), the odd one last
        for i2 in range(n_steps // 2):
            s0 = (2 * i2) % STAGES
            s1 = (2 * i2 + 1) % STAGES
            mbarrier.wait(ready.index(s0), ((2 * i2) // STAGES) & 1)
            mbarrier.wait(ready.index(s1), ((2 * i2 + 1) // STAGES) & 1)
            w0 = _decode_slot(code_s.index(s0 * TILES + TILE), scale_s.index(s0 * TILES + TILE), W_NV, PAIRS, SL,
                              SVIEW, DOT, ROWS3)
            w1 = _decode_slot(code_s.index(s1 * TILES + TILE), scale_s.index(s1 * TILES + TILE), W_NV, PAIRS, SL,
                              SVIEW, DOT, ROWS3)
            fence_async_shared()
            acc_g = warpgroup_mma(w0, x_s.index(s0).permute((1, 0)), acc_g, is_async=True)
            acc_g = warpgroup_mma(w1, x_s.index(s1).permute((1, 0)), acc_g, is_async=True)
            acc_g, w0, w1 = warpgroup_mma_wait(0, deps=[acc_g, w0, w1])
            mbarrier.arrive(empty.index(s0))
            mbarrier.arrive(empty.index(s1))
        if n_steps % 2 == 1:
            s = (n_steps - 1) % STAGES
            mbarrier.wait(ready.index(s), ((n_steps - 1) // STAGES) & 1)
            w0 = _decode_slot(code_s.index(s * TILES + TILE), scale_s.index(s * TILES + TILE), W_NV, PAIRS, SL,
                              SVIEW, DOT, ROWS3)
            fence_async_shared()
            acc_g = warpgroup_mma(w0, x_s.index(s).permute((1, 0)), acc_g, is_async=True)
            acc_g, w0 = warpgroup_mma_wait(0, deps=[acc_g, w0])
            mbarrier.arrive(empty.index(s))
    for i in range(0 if PAIRED else n_steps):
        s = (it0 + i) % STAGES
        mbarrier.wait(ready.index(s), ((it0 + i) // STAGES) & 1)
        slot = (s * TILES + TILE) * NB
        wg = _decode_slot(code_s.index(slot), scale_s.index(slot), W_NV, PAIRS, SL, SVIEW, DOT, ROWS3)
        xt = x_s.index(s).permute((1, 0))
        if OVERLAP == 0:
            fence_async_shared()  # the activation rows came by cp.async (generic proxy); wgmma reads them (async)
            acc_g = warpgroup_mma(wg, xt, acc_g, is_async=True)
            if GATED:
                wu = _decode_slot(code_s.index(slot + 1), scale_s.index(slot + 1), W_NV, PAIRS, SL, SVIEW, DOT,
                                  ROWS3)
                acc_u = warpgroup_mma(wu, xt, acc_u, is_async=True)
                acc_g, acc_u, wg, wu = warpgroup_mma_wait(0, deps=[acc_g, acc_u, wg, wu])
            else:
                acc_g, wg = warpgroup_mma_wait(0, deps=[acc_g, wg])
            mbarrier.arrive(empty.index(s))  # the slot's codes, scales and rows are read: the producer may refill
        else:
            if GATED:
                wu = _decode_slot(code_s.index(slot + 1), scale_s.index(slot + 1), W_NV, PAIRS, SL, SVIEW, DOT,
                                  ROWS3)
            fence_async_shared()
            acc_g = warpgroup_mma(wg, xt, acc_g, is_async=True)
            if GATED:
                acc_u = warpgroup_mma(wu, xt, acc_u, is_async=True)
            # OVERLAP 2 leaves this step's NB MMA groups in flight (their register operands stay live through the
            # next decode): the previous step's are then complete and its slot may be refilled
            LAG: gl.constexpr = NB if OVERLAP == 2 else 0
            if GATED:
                acc_g, acc_u, wg, wu = warpgroup_mma_wait(LAG, deps=[acc_g, acc_u, wg, wu])
            else:
                acc_g, wg = warpgroup_mma_wait(LAG, deps=[acc_g, wg])
            if OVERLAP == 2:
                mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), pred=i > 0)
            else:
                mbarrier.arrive(empty.index(s))
    acc_g, acc_u = warpgroup_mma_wait(0, deps=[acc_g, acc_u])
    if DIRECT:
        gl.static_assert(SPLIT_K == 1, "the direct epilogue takes the whole K in one program")
        _direct_epilogue(acc_g, acc_u, sorted_rows_ptr, n_pairs, N_OUT, pid_m, g_col, GATED, BM, block_expert_ptr,
                         final_ptr, a_scale_ptr, expert_scale_ptr, bias_ptr, q_scale_ptr, N_ROWS, alpha, beta,
                         beta_lin, limit, A_SCALE, HAS_EXPERT_SCALE, HAS_BIAS, INTERLEAVED, ACT, APPLY_ACT, HAS_LIMIT,
                         QUANT_NVFP4)
        return
    pair = gl.load(sorted_rows_ptr + pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(0, ACC_L)))
    n = g_col + gl.arange(0, 64, layout=gl.SliceLayout(1, ACC_L))
    part = ((pid_s * n_pairs + pair.to(gl.int64))[None, :] * 2) * N_OUT + n[:, None]
    mask = (pair < n_pairs)[None, :] & (n < N_OUT)[:, None]
    gl.store(out_ptr + part, acc_g, mask=mask)
    if GATED:
        gl.store(out_ptr + part + N_OUT, acc_u, mask=mask)
    if SERIAL and g_col < N_OUT:  # (the last program's second tile may lie past N_OUT: no outputs, no count)
        # the warpgroup's partial stores (a barrier of its 128 threads: bar.sync of the partition), then one count a
        # tile (acquire-release: the last split's loads see every split's stores; they read past L1)
        _partition_barrier()
        if SPLIT_K == 1:
            _serial_epilogue(out_ptr, sorted_rows_ptr, n_pairs, N_OUT, pid_m, g_col, GATED, SPLIT_K, BM, count_ptr,
                             block_expert_ptr, final_ptr, a_scale_ptr, expert_scale_ptr, bias_ptr, q_scale_ptr, N_ROWS,
                             alpha, beta, beta_lin, limit, A_SCALE, HAS_EXPERT_SCALE, HAS_BIAS, INTERLEAVED, ACT,
                             APPLY_ACT, HAS_LIMIT, QUANT_NVFP4)
        else:
            tile = pid_m * ((N_OUT + 63) // 64) + g_col // 64
            arrived = gl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
            if arrived == SPLIT_K - 1:
                _serial_epilogue(out_ptr, sorted_rows_ptr, n_pairs, N_OUT, pid_m, g_col, GATED, SPLIT_K, BM,
                                 count_ptr, block_expert_ptr, final_ptr, a_scale_ptr, expert_scale_ptr, bias_ptr,
                                 q_scale_ptr, N_ROWS, alpha, beta, beta_lin, limit, A_SCALE, HAS_EXPERT_SCALE, HAS_BIAS,
                                 INTERLEAVED, ACT, APPLY_ACT, HAS_LIMIT, QUANT_NVFP4)
                gl.atomic_xchg(count_ptr + tile, 0)  # ready for the next launch


EPILOGUE = gl.constexpr(gl.BlockedLayout([1, 2], [4, 8], [4, 1], [1, 0]))  # [16 pairs, 64 rows] over a warpgroup


@gluon.jit
def _serial_epilogue(part_ptr, sorted_rows_ptr, n_pairs, N_OUT, pid_m, g_col, GATED: gl.constexpr,
                     SPLIT_K: gl.constexpr, BM: gl.constexpr, count_ptr, block_expert_ptr, final_ptr, a_scale_ptr,
                     expert_scale_ptr, bias_ptr, q_scale_ptr, N_ROWS, alpha, beta, beta_lin, limit,
                     A_SCALE: gl.constexpr, HAS_EXPERT_SCALE: gl.constexpr, HAS_BIAS: gl.constexpr,
                     INTERLEAVED: gl.constexpr, ACT: gl.constexpr, APPLY_ACT: gl.constexpr, HAS_LIMIT: gl.constexpr,
                     QUANT_NVFP4: gl.constexpr):
    """splitk_epilogue_kernel's work for one 64-row tile of one expert block: the partial sums
    [SPLIT_K, pairs, 2, N_OUT] added in split order from zero, then triton_kernels._epilogue (scales, bias, the bf16
    rounding points, the activation, GEMM2's NVFP4 input where GEMM1 quantizes it) into the output: the same
    operations on the same values, so the same bits (final_ptr the output; the rest splitk_epilogue_kernel's)."""
    pair = gl.load(sorted_rows_ptr + pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, EPILOGUE)))
    m_mask = pair < n_pairs
    n_offs = g_col + gl.arange(0, 64, layout=gl.SliceLayout(0, EPILOGUE))
    n_mask = n_offs < N_OUT
    acc_g, acc_u = K.add_split_partials(part_ptr, gl.zeros([BM, 64], gl.float32, EPILOGUE),
                                        gl.zeros([BM, 64], gl.float32, EPILOGUE), pair, m_mask, n_offs, n_mask,
                                        n_pairs, N_OUT, GATED, SPLIT_K, ".cg")
    expert = gl.load(block_expert_ptr + pid_m)
    g_row, u_row = K._gate_up_rows(n_offs, N_OUT, GATED, INTERLEAVED)
    K._epilogue(acc_g, acc_u, pair, m_mask, n_offs, n_mask, g_row, u_row, expert, a_scale_ptr, expert_scale_ptr,
                bias_ptr, final_ptr, N_OUT, N_ROWS, alpha, beta, beta_lin, limit, A_SCALE, HAS_EXPERT_SCALE, HAS_BIAS,
                GATED, ACT, APPLY_ACT, HAS_LIMIT, q_scale_ptr, QUANT_NVFP4, BM, 64)


@gluon.jit
def _direct_epilogue(acc_g, acc_u, sorted_rows_ptr, n_pairs, N_OUT, pid_m, g_col, GATED: gl.constexpr,
                     BM: gl.constexpr, block_expert_ptr, final_ptr, a_scale_ptr, expert_scale_ptr, bias_ptr,
                     q_scale_ptr, N_ROWS, alpha, beta, beta_lin, limit, A_SCALE: gl.constexpr,
                     HAS_EXPERT_SCALE: gl.constexpr, HAS_BIAS: gl.constexpr, INTERLEAVED: gl.constexpr,
                     ACT: gl.constexpr, APPLY_ACT: gl.constexpr, HAS_LIMIT: gl.constexpr, QUANT_NVFP4: gl.constexpr):
    """moe_gemm_kernel's epilogue (triton_kernels._epilogue: scales, bias, the bf16 rounding points, the activation,
    GEMM2's NVFP4 input where GEMM1 quantizes it) of one warpgroup's [64 rows, BM pairs] accumulators, transposed
    to [BM pairs, 64 rows] through shared memory, into final_ptr: the sums of the whole K, so no partial sums
    travel through memory (prefill: GEMM1's partials of Kimi-K2 at 8192 tokens would be 1 GB each way)."""
    g = gl.convert_layout(gl.permute(acc_g, (1, 0)), EPILOGUE)
    if GATED:
        u = gl.convert_layout(gl.permute(acc_u, (1, 0)), EPILOGUE)
    else:
        u = g
    pair = gl.load(sorted_rows_ptr + pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, EPILOGUE)))
    m_mask = pair < n_pairs
    n_offs = g_col + gl.arange(0, 64, layout=gl.SliceLayout(0, EPILOGUE))
    n_mask = n_offs < N_OUT
    expert = gl.load(block_expert_ptr + pid_m)
    g_row, u_row = K._gate_up_rows(n_offs, N_OUT, GATED, INTERLEAVED)
    K._epilogue(g, u, pair, m_mask, n_offs, n_mask, g_row, u_row, expert, a_scale_ptr, expert_scale_ptr, bias_ptr,
                final_ptr, N_OUT, N_ROWS, alpha, beta, beta_lin, limit, A_SCALE, HAS_EXPERT_SCALE, HAS_BIAS, GATED, ACT,
                APPLY_ACT, HAS_LIMIT, q_scale_ptr, QUANT_NVFP4, BM, 64)


@gluon.jit
def _grouped_tile_order(pid_m, pid_n, n_blocks_m, n_blocks_n, GROUP_M: gl.constexpr):
    """triton_kernels.grouped_tile_order, called from a kernel whose K argument (the GEMM's K) hides the module."""
    return K.grouped_tile_order(pid_m, pid_n, n_blocks_m, n_blocks_n, GROUP_M)


@gluon.jit
def _ring(codes_desc, scales_desc, GATED: gl.constexpr, W_NV: gl.constexpr, STAGES: gl.constexpr, TILES: gl.constexpr,
          BM: gl.constexpr, XS: gl.constexpr, PW: gl.constexpr = PRODUCER_WARPS):
    """The STAGES-deep ring in shared memory (each slot: every tile's codes and scale box, the block's activation
    rows) and its ready / empty mbarriers, initialised."""
    NB: gl.constexpr = 2 if GATED else 1
    code_s = gl.allocate_shared_memory(gl.int32, [STAGES * TILES * NB, 32, 32], codes_desc.layout)
    SB: gl.constexpr = 2 if W_NV else 1  # rows of 256 scale bytes a tile: 4 (MX) or 8 (NVFP4) bytes a row
    scale_s = gl.allocate_shared_memory(gl.uint8, [STAGES * TILES * NB, SB, 256], scales_desc.layout)
    x_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BM, 128], XS)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=32 * PW + 1)  # a cp.async arrive a thread, expect's
        mbarrier.init(empty.index(s), count=TILES)  # each consumer warpgroup releases the slot
    return code_s, scale_s, x_s, ready, empty


@gluon.jit
def _item(w, n_blocks, n_tiles, chunks, SPLIT_K: gl.constexpr, TILES: gl.constexpr):
    """Work item w of a persistent launch as the program ids of the plain grid (expert block fastest, as that
    grid runs) and its K chunks: (pid_m, first row of the program's first tile, pid_s, c_lo, c_hi)."""
    pid_m = w % n_blocks
    pid_n = (w // n_blocks) % n_tiles
    pid_s = w // (n_blocks * n_tiles)
    per = gl.cdiv(chunks, SPLIT_K)
    c_lo = pid_s * per
    return pid_m, pid_n * (64 * TILES), pid_s, c_lo, gl.minimum(c_lo + per, chunks)


@gluon.jit
def _consumer_items(code_s, scale_s, x_s, ready, empty, block_expert_ptr, n_blocks, n_tiles, chunks, out_ptr,
                    sorted_rows_ptr, n_pairs, N_OUT, TILE: gl.constexpr, TILES: gl.constexpr, GATED: gl.constexpr,
                    W_NV: gl.constexpr, STAGES: gl.constexpr, BM: gl.constexpr, ACC_L: gl.constexpr,
                    DOT: gl.constexpr, PAIRS: gl.constexpr, ROWS3: gl.constexpr, SVIEW: gl.constexpr,
                    SPLIT_K: gl.constexpr):
    """A persistent program's consumer warpgroup: work items program_id, + num_programs, ... (_item), each as the
    plain launch's program (schedule 0), on one ring whose position runs on from item to item."""
    it = 0
    for w in range(gl.program_id(0), n_blocks * n_tiles * SPLIT_K, gl.num_programs(0)):
        pid_m, g_col, pid_s, c_lo, c_hi = _item(w, n_blocks, n_tiles, chunks, SPLIT_K, TILES)
        if gl.load(block_expert_ptr + pid_m) >= 0:
            _consumer(code_s, scale_s, x_s, ready, empty, c_lo, c_hi, out_ptr, sorted_rows_ptr, n_pairs, N_OUT, pid_m,
                      pid_s, g_col + 64 * TILE, TILE, TILES, GATED, W_NV, STAGES, BM, ACC_L, DOT, PAIRS, ROWS3, SVIEW,
                      0, it)
            it += gl.maximum(c_hi - c_lo, 0)


@gluon.jit
def _producer_items(codes_desc, scales_desc, a_ptr, sorted_rows_ptr, block_expert_ptr, n_blocks, n_tiles, chunks,
                    n_pairs, a_row_div, K, N_OUT, code_s, scale_s, x_s, ready, empty, N_ROWS, GATED: gl.constexpr,
                    W_NV: gl.constexpr, STAGES: gl.constexpr, TILES: gl.constexpr, BM: gl.constexpr,
                    XL: gl.constexpr, SPLIT_K: gl.constexpr):
    """A persistent program's producer: the same items in the same order as _consumer_items, the next item's
    first K steps loaded while the consumers still finish the one before (no ring fill between items)."""
    it = 0
    for w in range(gl.program_id(0), n_blocks * n_tiles * SPLIT_K, gl.num_programs(0)):
        pid_m, g_col, pid_s, c_lo, c_hi = _item(w, n_blocks, n_tiles, chunks, SPLIT_K, TILES)
        expert = gl.load(block_expert_ptr + pid_m)
        if expert >= 0:
            _producer(codes_desc, scales_desc, a_ptr, sorted_rows_ptr, n_pairs, a_row_div, K, N_OUT, code_s,
                      scale_s, x_s, ready, empty, pid_m, expert * (N_ROWS // 2), expert * chunks, g_col, c_lo, c_hi,
                      N_ROWS, GATED, W_NV, STAGES, TILES, BM, XL, it)
            it += gl.maximum(c_hi - c_lo, 0)


@gluon.jit
def bitplace_partials_kernel(codes_desc, scales_desc, a_ptr, out_ptr, sorted_rows_ptr, block_expert_ptr, n_pairs,
                             a_row_div, N_OUT, N_ROWS, K, chunks, GATED: gl.constexpr, W_NV: gl.constexpr,
                             STAGES: gl.constexpr,
                             SPLIT_K: gl.constexpr, OVERLAP: gl.constexpr, TILES: gl.constexpr, ACC_L: gl.constexpr,
                             DOT: gl.constexpr, PAIRS: gl.constexpr, ROWS3: gl.constexpr, SVIEW: gl.constexpr,
                             XS: gl.constexpr, XL: gl.constexpr, codes_ptr=None, scales_ptr=None,
                             PDL: gl.constexpr = 0, PERSIST: gl.constexpr = 0, n_blocks=0, SERIAL: gl.constexpr = 0,
                             count_ptr=None, final_ptr=None, a_scale_ptr=None, expert_scale_ptr=None, bias_ptr=None,
                             q_scale_ptr=None, alpha=0.0, beta=0.0, beta_lin=0.0, limit=0.0,
                             A_SCALE: gl.constexpr = 0, HAS_EXPERT_SCALE: gl.constexpr = False,
                             HAS_BIAS: gl.constexpr = False, INTERLEAVED: gl.constexpr = False, ACT: gl.constexpr = 0,
                             APPLY_ACT: gl.constexpr = False, HAS_LIMIT: gl.constexpr = False,
                             QUANT_NVFP4: gl.constexpr = False, ids_ptr=None, P_IDS: gl.constexpr = 16,
                             prefetch_chunks=0, TILE_MAJOR: gl.constexpr = 0, BM: gl.constexpr = 16,
                             DIRECT: gl.constexpr = 0, PW: gl.constexpr = PRODUCER_WARPS,
                             PREGS: gl.constexpr = 40, SREGS: gl.constexpr = SECOND_CONSUMER_REGS,
                             GROUP_M: gl.constexpr = 0):
    """fp32 partial sums [SPLIT_K, pairs, 2, N_OUT] of expert block program_id(0) (16 pairs), output rows
    64 TILES program_id(1) .. + 64 TILES - 1 (gate; up N_OUT rows on when GATED), K chunks of share program_id(2).
    TILES 2: two consumer warpgroups, a 64-row tile each, on one ring (the activation rows loaded once).
    PDL (a programmatic dependent, triton_kernels.PDL_ORDER): 1 waits at entry (GEMM1: its block's expert comes from
    the kernel before); 2 (ungated: GEMM2) prefetches its weights into L2 from codes_ptr / scales_ptr (the bytes
    behind the descriptors) first, then waits; both then let the next kernel launch. 3 (GEMM1 at most 16 tokens):
    before its wait, finds its block's expert from the call's expert ids (ids_ptr, n_pairs of them, at most P_IDS;
    _block_expert_by_rank) and prefetches its first prefetch_chunks K chunks of gate and up weights into L2, so that
    the weight stream starts while the routing launch still runs; the expert it computes with is still
    block_expert's, read after the wait (the prefetch is a hint: a wrong guess costs bandwidth, never bits).
    TILE_MAJOR 1: codes_desc / scales_desc (and codes_ptr / scales_ptr) of tile_major_codes / tile_major_scales'
    layout: each 64-row tile's K steps one contiguous run (N_ROWS and, gated, N_OUT multiples of 64; not persistent).
    PERSIST 1: a persistent grid (one dimension, at most the programs that fit at once): each program runs the work
    items program_id(0), + num_programs(0), ... of the plain grid's n_blocks x N tiles x SPLIT_K (_item) on one ring,
    the next item's loads under the last one's MMAs and stores (schedule 0; PDL 1 or none).
    SERIAL 1 (not persistent): each 64-row tile finished in this launch by its last split (count_ptr: an int32 a tile,
    zero before the launch and reset after; _serial_epilogue into final_ptr with splitk_epilogue_kernel's operands
    and flags), instead of a splitk_epilogue_kernel launch after it.
    Prefill (the tiles' gluon_prefill): BM pairs an expert block (32-128: the wgmma's N; 16 at decode), DIRECT 1 (split
    1) moe_gemm_kernel's epilogue from the accumulators into final_ptr (_direct_epilogue; out_ptr unused), PW producer
    warps at PREGS registers (4 at 56: a warp of 64 rows' cp.async addresses would spill), SREGS the second consumer's,
    GROUP_M the programs in groups of that many expert blocks (grouped_tile_order)."""
    if PDL == 1:
        gdc_wait()
        gdc_launch_dependents()
    if PERSIST:
        gl.static_assert(SERIAL == 0, "a persistent launch leaves the epilogue to splitk_epilogue_kernel")
        gl.static_assert(TILE_MAJOR == 0, "a persistent launch reads the pair-row layout")
        code_s, scale_s, x_s, ready, empty = _ring(codes_desc, scales_desc, GATED, W_NV, STAGES, TILES, BM, XS)
        n_tiles = gl.cdiv(N_OUT, 64 * TILES)
        if TILES == 1:
            gl.warp_specialize(
                [(_consumer_items, (code_s, scale_s, x_s, ready, empty, block_expert_ptr, n_blocks, n_tiles, chunks,
                                    out_ptr, sorted_rows_ptr, n_pairs, N_OUT, 0, TILES, GATED, W_NV, STAGES, BM, ACC_L,
                                    DOT, PAIRS, ROWS3, SVIEW, SPLIT_K)),
                 (_producer_items, (codes_desc, scales_desc, a_ptr, sorted_rows_ptr, block_expert_ptr, n_blocks,
                                    n_tiles, chunks, n_pairs, a_row_div, K, N_OUT, code_s, scale_s, x_s, ready, empty,
                                    N_ROWS, GATED, W_NV, STAGES, TILES, BM, XL, SPLIT_K))],
                [PRODUCER_WARPS], [40])
        else:
            gl.warp_specialize(
                [(_consumer_items, (code_s, scale_s, x_s, ready, empty, block_expert_ptr, n_blocks, n_tiles, chunks,
                                    out_ptr, sorted_rows_ptr, n_pairs, N_OUT, 0, TILES, GATED, W_NV, STAGES, BM, ACC_L,
                                    DOT, PAIRS, ROWS3, SVIEW, SPLIT_K)),
                 (_consumer_items, (code_s, scale_s, x_s, ready, empty, block_expert_ptr, n_blocks, n_tiles, chunks,
                                    out_ptr, sorted_rows_ptr, n_pairs, N_OUT, 1, TILES, GATED, W_NV, STAGES, BM, ACC_L,
                                    DOT, PAIRS, ROWS3, SVIEW, SPLIT_K)),
                 (_producer_items, (codes_desc, scales_desc, a_ptr, sorted_rows_ptr, block_expert_ptr, n_blocks,
                                    n_tiles, chunks, n_pairs, a_row_div, K, N_OUT, code_s, scale_s, x_s, ready, empty,
                                    N_ROWS, GATED, W_NV, STAGES, TILES, BM, XL, SPLIT_K))],
                [4, PRODUCER_WARPS], [SECOND_CONSUMER_REGS, 40])
    else:
        pid_m = gl.program_id(0)
        pid_n = gl.program_id(1)
        pid_s = gl.program_id(2)
        if GROUP_M:  # prefill: GROUP_M expert blocks' N tiles run together (their rows and weights shared in L2)
            pid_m, pid_n = _grouped_tile_order(pid_m, pid_n, gl.num_programs(0), gl.num_programs(1), GROUP_M)
        per = gl.cdiv(chunks, SPLIT_K)
        c_lo = pid_s * per
        c_hi = gl.minimum(c_lo + per, chunks)
        g_col = pid_n * (64 * TILES)  # the first tile's first gate row (row pairs: the gate rows, then the up rows)
        if PDL == 3:
            gl.static_assert(GATED, "PDL 3 is GEMM1's mode (gate and up rows)")
            guess = _block_expert_by_rank(ids_ptr, n_pairs, pid_m, P_IDS)
            if guess >= 0:
                c_end = gl.minimum(c_hi, c_lo + prefetch_chunks)
                for half in gl.static_range(2):  # the gate rows, then the up rows
                    _prefetch_program_weights(codes_ptr, scales_ptr, guess * (N_ROWS // 2), guess * chunks,
                                              g_col + half * N_OUT, c_lo, c_end, chunks, N_ROWS, TILES,
                                              8 if W_NV else 4, TILE_MAJOR)
            gdc_wait()  # block_expert and the activations (the routing launch's) and every write after
            gdc_launch_dependents()
        expert = gl.load(block_expert_ptr + pid_m)
        if expert >= 0:
            if PDL == 2:
                _prefetch_program_weights(codes_ptr, scales_ptr, expert * (N_ROWS // 2), expert * chunks, g_col, c_lo,
                                          c_hi, chunks, N_ROWS, TILES, 8 if W_NV else 4, TILE_MAJOR)
                gdc_wait()  # the activation rows (GEMM1's, by its epilogue kernel or its own) and every write after
                gdc_launch_dependents()
            code_s, scale_s, x_s, ready, empty = _ring(codes_desc, scales_desc, GATED, W_NV, STAGES, TILES, BM, XS, PW)
            code_row = expert * (N_ROWS // 2)
            scale_row = expert * chunks
            if TILES == 1:
                gl.warp_specialize(
                    [(_consumer, (code_s, scale_s, x_s, ready, empty, c_lo, c_hi, out_ptr, sorted_rows_ptr, n_pairs,
                                  N_OUT, pid_m, pid_s, g_col, 0, TILES, GATED, W_NV, STAGES, BM, ACC_L, DOT, PAIRS,
                                  ROWS3, SVIEW, OVERLAP, 0, SPLIT_K, SERIAL, count_ptr, block_expert_ptr, final_ptr,
                                  a_scale_ptr, expert_scale_ptr, bias_ptr, q_scale_ptr, N_ROWS, alpha, beta, beta_lin,
                                  limit, A_SCALE, HAS_EXPERT_SCALE, HAS_BIAS, INTERLEAVED, ACT, APPLY_ACT, HAS_LIMIT,
                                  QUANT_NVFP4, DIRECT)),
                     (_producer, (codes_desc, scales_desc, a_ptr, sorted_rows_ptr, n_pairs, a_row_div, K, N_OUT, code_s,
                                  scale_s, x_s, ready, empty, pid_m, code_row, scale_row, g_col, c_lo, c_hi, N_ROWS,
                                  GATED, W_NV, STAGES, TILES, BM, XL, 0, TILE_MAJOR, chunks))],
                    [PW], [PREGS])
            else:
                gl.warp_specialize(
                    [(_consumer, (code_s, scale_s, x_s, ready, empty, c_lo, c_hi, out_ptr, sorted_rows_ptr, n_pairs,
                                  N_OUT, pid_m, pid_s, g_col, 0, TILES, GATED, W_NV, STAGES, BM, ACC_L, DOT, PAIRS,
                                  ROWS3, SVIEW, OVERLAP, 0, SPLIT_K, SERIAL, count_ptr, block_expert_ptr, final_ptr,
                                  a_scale_ptr, expert_scale_ptr, bias_ptr, q_scale_ptr, N_ROWS, alpha, beta, beta_lin,
                                  limit, A_SCALE, HAS_EXPERT_SCALE, HAS_BIAS, INTERLEAVED, ACT, APPLY_ACT, HAS_LIMIT,
                                  QUANT_NVFP4, DIRECT)),
                     (_consumer, (code_s, scale_s, x_s, ready, empty, c_lo, c_hi, out_ptr, sorted_rows_ptr, n_pairs,
                                  N_OUT, pid_m, pid_s, g_col + 64, 1, TILES, GATED, W_NV, STAGES, BM, ACC_L, DOT, PAIRS,
                                  ROWS3, SVIEW, OVERLAP, 0, SPLIT_K, SERIAL, count_ptr, block_expert_ptr, final_ptr,
                                  a_scale_ptr, expert_scale_ptr, bias_ptr, q_scale_ptr, N_ROWS, alpha, beta, beta_lin,
                                  limit, A_SCALE, HAS_EXPERT_SCALE, HAS_BIAS, INTERLEAVED, ACT, APPLY_ACT, HAS_LIMIT,
                                  QUANT_NVFP4, DIRECT)),
                     (_producer, (codes_desc, scales_desc, a_ptr, sorted_rows_ptr, n_pairs, a_row_div, K, N_OUT, code_s,
                                  scale_s, x_s, ready, empty, pid_m, code_row, scale_row, g_col, c_lo, c_hi, N_ROWS,
                                  GATED, W_NV, STAGES, TILES, BM, XL, 0, TILE_MAJOR, chunks))],
                    [4, PW], [SREGS, PREGS])


def scales_by_chunk(scales, n_rows: int, chunks: int, per_chunk: int = 4):
    """triton_bitplace's block scales with rows in pairs ([E, N, chunks * per_chunk] bytes, pair_rows of
    per_chunk-byte chunks: 4 MX, 8 NVFP4) -> [E * chunks, N * per_chunk]: each chunk's bytes of every row in row
    order, so that one TMA box holds a tile's scales of one K step (the pair layout's 8- and 16-byte runs are at or
    below TMA's 16-byte minimum and apart). A pure data movement."""
    e = scales.shape[0]
    rows = scales.view(e, n_rows // 2, chunks, 2, per_chunk).permute(0, 2, 1, 3, 4)  # [E, chunks, N / 2, 2, per]
    return rows.reshape(e * chunks, n_rows * per_chunk).contiguous()


def tile_major_codes(codes):
    """triton_bitplace's codes with rows in pairs ([E, N, chunks x 64] bytes: [E, N / 2 pairs, chunks, 128]) ->
    [E x N / 64 x chunks x 32, 32] int32: each 64-row tile's chunks one after another, a chunk's 32 row pairs as one
    4 KB run (the TMA box of _code_box_at's TILE_MAJOR), so that a program's K steps read one contiguous run of
    its tile instead of 128 bytes from each of 32 rows (N a multiple of 64). A pure data movement."""
    e, n, width = codes.shape
    if n % 64 or width % 64:
        raise ValueError(f"tile_major_codes takes rows in whole 64-row tiles and whole chunks, got {tuple(codes.shape)}")
    tiles = codes.view(e, n // 64, 32, width // 64, 128).transpose(2, 3).contiguous()
    return tiles.view(torch.int32).reshape(-1, 32)


def tile_major_scales(scales, per_chunk: int = 4):
    """triton_bitplace's block scales with rows in pairs ([E, N, chunks x per_chunk] bytes) -> [E x N / 64 x chunks
    x per_chunk / 4, 256]: a 64-row tile's scale bytes of one chunk (the same 256 or 512 bytes in the same order as
    scales_by_chunk's box) one after another along the tile's chunks. A pure data movement."""
    e, n, width = scales.shape
    if n % 64 or width % per_chunk:
        raise ValueError(f"tile_major_scales takes whole 64-row tiles and chunks, got {tuple(scales.shape)}")
    tiles = scales.view(e, n // 64, 32, width // per_chunk, 2 * per_chunk).transpose(2, 3).contiguous()
    return tiles.reshape(-1, 256)


def check_partition_registers(maxnreg: int, warpgroups: int, producer_regs: int, second: int):
    """Refuse a warp-specialised launch's register split that setmaxnreg cannot give: the launch's cap over its
    threads within a multiprocessor's 65536 registers (three warpgroups: at most 168), each fixed partition's count a
    multiple of 8 in 24-256 (setmaxnreg's range)."""
    problems = [why for bad, why in (
        (maxnreg * 128 * warpgroups > 65536, f"maxnreg {maxnreg} x {128 * warpgroups} threads within 65536 registers"),
        (producer_regs % 8 or not 24 <= producer_regs <= 256, f"producer registers {producer_regs}"),
        (warpgroups > 2 and (second % 8 or not 24 <= second <= 256), f"second consumer registers {second}")) if bad]
    if problems:
        raise ValueError("setmaxnreg takes multiples of 8 in 24-256 a partition, the cap times the threads at most "
                         "65536: " + "; ".join(problems))


def launch_bitplace_partials(launcher, codes, scales_t, a, partials, sorted_rows, block_expert, n_pairs: int,
                             a_row_div: int, n_out: int, n_rows: int, k_dim: int, gated: bool, split_k: int,
                             stages: int, maxnreg: int, overlap: int = 0, tiles: int = 1, nvfp4: int = 0,
                             pdl: int = 0, persistent: int = 0, serial: dict | None = None,
                             prefetch: tuple | None = None, tile_major: tuple | None = None, bm: int = 16,
                             direct: dict | None = None, producer: tuple | None = None, group_m: int = 0):
    """One launch of bitplace_partials_kernel through `launcher` (triton_kernels' attribute, so that
    compile_check can record it): codes [E, N_ROWS, chunks * 64] bytes (rows in pairs), scales_t from
    scales_by_chunk, partials fp32 [split_k, n_pairs, 2, n_out]; overlap: the consumer's schedule (_consumer);
    tiles: 64-row tiles (consumer warpgroups) a program, 1 or 2; nvfp4: NVFP4 weights (scales_t of 8 bytes a row
    and chunk, read as rows of 256 bytes: n_rows and n_out multiples of 32), 2 where every scale is a normal E4M3
    number, 3 where they are positive too and stored biased (1 + triton_kernels._nvfp4_factor_words' NORMAL); pdl: 0, or the kernel's PDL mode as a
    programmatic dependent (1 GEMM1, 2 GEMM2: ungated only; triton_kernels.PDL_ORDER); persistent: 0, or that many
    programs, each running the plain grid's programs program_id, + persistent, ... on one ring (PERSIST; schedule 0,
    GEMM2's prefetch mode 2 as mode 1: the items' weights are not one program's); serial: None, or the kernel's
    SERIAL operands (count_ptr, final_ptr, splitk_epilogue_kernel's scales, bias, scalars and flags): each tile finished
    in this launch, no epilogue kernel after it; prefetch: None, or (the call's expert ids, flat; K chunks) for GEMM1's
    PDL 3: each program's first that many chunks of weights into L2 before its wait (at most 16 tokens, pdl 1);
    tile_major: None, or (tile_major_codes, tile_major_scales) of the same weights, read instead (TILE_MAJOR: n_rows
    and, gated, n_out multiples of 64; not persistent); bm: pairs an expert block (the wgmma's N: 16 at decode, 32-128
    at prefill, plain grid, no PDL); direct: None, or the epilogue's operands (serial's without count_ptr): the
    outputs written from the accumulators (split_k 1; partials unused); producer: None (one warp, 40 registers, a
    second consumer at SECOND_CONSUMER_REGS) or (warps, registers, second consumer's registers): at bm 64 one warp
    holding every row's address spills, four do not; group_m: the grid's programs in groups of that many expert
    blocks, each group's N tiles in turn (triton_kernels.grouped_tile_order)."""
    if pdl == 2 and gated:
        raise ValueError("pdl 2 (weights prefetched before the wait) is GEMM2's mode: ungated tiles only")
    if prefetch is not None:
        ids, prefetch_chunks = prefetch
        if not gated or pdl != 1 or persistent:
            raise ValueError("prefetch (GEMM1's weights into L2 before its wait, PDL 3) takes a gated GEMM launched "
                             f"as a dependent (pdl 1) on the plain grid; got gated {gated}, pdl {pdl}, persistent "
                             f"{persistent}")
        if a.shape[0] > 16 or ids.numel() != n_pairs:
            raise ValueError(f"prefetch finds a block's expert by ranking the expert ids, which holds where no expert "
                             f"has more than 16 pairs: at most 16 tokens and the call's {n_pairs} ids; got "
                             f"{a.shape[0]} tokens and {ids.numel()} ids")
    if bm not in (16, 32, 64, 128) or bm != 16 and (persistent or prefetch is not None or pdl):
        # (256 pairs: a gated tile's two accumulators alone would take 256 registers a thread)
        raise ValueError(f"bm (pairs an expert block) is 16, or 32, 64 or 128 on the plain grid without PDL, got bm "
                         f"{bm}, persistent {persistent}, pdl {pdl}")
    if direct and (split_k != 1 or serial or persistent):
        raise ValueError(f"direct (the epilogue from the accumulators) takes the whole K in one program: split_k 1, "
                         f"neither serial nor persistent; got split_k {split_k}, serial {bool(serial)}, "
                         f"persistent {persistent}")
    if group_m and persistent:
        raise ValueError("group_m orders the plain grid's programs: persistent 0")
    if persistent and serial:
        raise ValueError("a persistent launch leaves the epilogue to splitk_epilogue_kernel: serial with persistent 0")
    if persistent and overlap != 0:
        raise ValueError(f"a persistent launch runs the consumer's schedule 0 only, not {overlap}")
    if producer is not None:
        if persistent:  # (the persistent ring is built for PRODUCER_WARPS' arrivals)
            raise ValueError(f"producer (a {producer[0]}-warp producer partition) takes the plain grid: persistent 0, "
                             f"got {persistent}")
        check_partition_registers(maxnreg, 1 + tiles, producer[1], producer[2])
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    if tile_major is not None and (persistent or n_rows % 64 or gated and n_out % 64):
        raise ValueError(f"tile_major reads whole 64-row tiles on the plain grid: n_rows {n_rows} and, gated, n_out "
                         f"{n_out} multiples of 64, persistent 0 (got {persistent})")
    e = codes.shape[0]
    chunks = codes.shape[2] // 64
    if tile_major is not None:
        codes, scales_t = tile_major  # (the prefetches read these too)
        codes_desc = TensorDescriptor.from_tensor(codes, CODE_BOX, CODE_SMEM)
    else:
        codes_desc = TensorDescriptor.from_tensor(codes.view(e * n_rows // 2, chunks * 128).view(torch.int32),
                                                  CODE_BOX, CODE_SMEM)
    if nvfp4:
        scales_desc = TensorDescriptor.from_tensor(scales_t.view(-1, 256), NVFP4_SCALE_BOX, SCALE_SMEM)
    else:
        scales_desc = TensorDescriptor.from_tensor(scales_t, SCALE_BOX, SCALE_SMEM)
    grid = (block_expert.numel(), -(-n_out // (64 * tiles)), split_k)
    # (the prefetches' addresses are in bytes)
    extra = dict(codes_ptr=codes.view(torch.uint8), scales_ptr=scales_t, PDL=pdl, launch_pdl=True) if pdl else {}
    if group_m:
        extra["GROUP_M"] = group_m
    if tile_major is not None:
        extra["TILE_MAJOR"] = 1
    if prefetch is not None:
        extra.update(PDL=3, ids_ptr=ids, P_IDS=max(16, 1 << (n_pairs - 1).bit_length()),
                     prefetch_chunks=prefetch_chunks)
    if serial:  # the epilogue's products and sums rounded one by one, as splitk_epilogue_kernel's (no contraction)
        extra.update(SERIAL=1, enable_fp_fusion=False, **serial)
    if direct:  # (the same roundings as moe_gemm_kernel's epilogue, compiled without contraction too)
        extra.update(DIRECT=1, enable_fp_fusion=False, **direct)
    acc_layout, dot_layout = accumulator_layouts(bm)
    x_load = X_LOAD
    if producer is not None:  # (warps, registers) of the producer partition, registers of a second consumer
        warps, regs, second = producer
        x_load = gl.BlockedLayout([1, 8], [2, 16], [warps, 1], [1, 0])
        extra.update(PW=warps, PREGS=regs, SREGS=second)
    if persistent:
        grid = (min(persistent, grid[0] * grid[1] * grid[2]),)
        extra.update(PERSIST=1, n_blocks=block_expert.numel(), **(dict(PDL=1) if pdl else {}))
    return launcher[grid](codes_desc, scales_desc, a, partials, sorted_rows, block_expert, n_pairs, a_row_div, n_out,
                          n_rows, k_dim, chunks, GATED=gated, W_NV=nvfp4, STAGES=stages, SPLIT_K=split_k, OVERLAP=overlap,
                          TILES=tiles, ACC_L=acc_layout, DOT=dot_layout, PAIRS=CODE_PAIRS, ROWS3=CODE_ROWS,
                          SVIEW=SCALE_ROWS, XS=X_SMEM, XL=x_load, num_warps=4, maxnreg=maxnreg, BM=bm, **extra)


# ---- bf16 prefill: the same warp specialisation with bf16 weights, both operands of the wgmma from shared memory ----
W_BF16_SMEM = X_SMEM  # a [64 rows, 64] bf16 weight box: 128-byte rows, 128-byte swizzle, as the activation rows'
BF16_BLOCK_K = 64  # K a step: a box row of 128 bytes (the swizzle's width)
# outputs a program: two consumer warpgroups of two [64, BM] accumulators (gated: gate and up of 64 outputs each)
BF16_GATED_OUTPUTS = gl.constexpr(128)
BF16_UNGATED_OUTPUTS = gl.constexpr(256)


@gluon.jit
def _bf16_box(w_row, g_col0, k, K, N_OUT, t: gl.constexpr, j: gl.constexpr, GATED: gl.constexpr,
              PAIRS: gl.constexpr):
    """[row, column] of weight box j of consumer warpgroup t at K offset k. Gated: j 0 the gate rows, 1 the up rows
    of the warpgroup's 64 outputs g_col0 + 64 t ..: up N_OUT rows on (halves), or, PAIRS (interleaved rows viewed
    as [E x N_OUT, 2 K]: gate row n's K values, then up row n's), the same row, K columns on. Ungated: the
    warpgroup's two 64-row tiles g_col0 + 128 t + 64 j."""
    if GATED:
        if PAIRS:
            return w_row + g_col0 + 64 * t, k + j * K
        return w_row + g_col0 + 64 * t + j * N_OUT, k
    return w_row + g_col0 + 128 * t + 64 * j, k


@gluon.jit
def _bf16_first_output(g_col0, t: gl.constexpr, j: gl.constexpr, GATED: gl.constexpr):
    """The first of the 64 outputs that accumulator j of consumer warpgroup t holds (gated: both accumulators, the
    gate and the up rows of the same outputs; ungated: its two 64-row tiles)."""
    if GATED:
        return g_col0 + 64 * t
    return g_col0 + 128 * t + 64 * j


@gluon.jit
def _bf16_item(w, n_blocks, N_OUT, GATED: gl.constexpr, GROUP_M: gl.constexpr):
    """Work item w as the plain 2-D grid's program (expert block fastest, as a grid's x runs), in GROUP_M's order:
    (expert block, first output of the program)."""
    wide: gl.constexpr = BF16_GATED_OUTPUTS if GATED else BF16_UNGATED_OUTPUTS
    n_n = gl.cdiv(N_OUT, wide)
    pid_m = w % n_blocks
    pid_n = w // n_blocks
    if GROUP_M:
        pid_m, pid_n = _grouped_tile_order(pid_m, pid_n, n_blocks, n_n, GROUP_M)
    return pid_m, pid_n * wide


@gluon.jit
def _bf16_producer(w_desc, a_ptr, sorted_rows_ptr, block_expert_ptr, n_blocks, n_items, n_pairs, a_row_div, K, N_OUT,
                   N_ROWS, w_s, x_s, ready, empty, GATED: gl.constexpr, PAIRS: gl.constexpr, STAGES: gl.constexpr,
                   BM: gl.constexpr, BK: gl.constexpr, XL: gl.constexpr, GROUP_M: gl.constexpr):
    """The program's work items (program_id, + num_programs, ...: one on the plain grid): each K step's four weight
    boxes (TMA) and the block's BM activation rows (cp.async, zeros past K and for the padding rows) into the ring,
    whose position runs on from item to item, a slot once both consumer warpgroups have released it; the next item's
    first steps load while the consumers still finish the one before."""
    n_steps = gl.cdiv(K, BK)
    cols = gl.arange(0, BK, layout=gl.SliceLayout(0, XL))
    it = 0
    for w in range(gl.program_id(0), n_items, gl.num_programs(0)):
        pid_m, g_col0 = _bf16_item(w, n_blocks, N_OUT, GATED, GROUP_M)
        expert = gl.load(block_expert_ptr + pid_m)
        if expert >= 0:
            w_row = expert * (N_OUT if PAIRS else N_ROWS)
            pair = gl.load(sorted_rows_ptr + pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, XL)))
            x_ptrs = a_ptr + (pair // a_row_div).to(gl.int64)[:, None] * K + cols[None, :]
            row_ok = (pair < n_pairs)[:, None]
            for i in range(n_steps):
                s = (it + i) % STAGES
                mbarrier.wait(empty.index(s), (((it + i) // STAGES) & 1) ^ 1)  # the first pass finds every slot free
                k = i * BK
                _cp_async(x_s.index(s), x_ptrs + k, mask=row_ok & (k + cols < K)[None, :])
                async_copy.mbarrier_arrive(ready.index(s), increment_count=False)  # (see _producer)
                mbarrier.expect(ready.index(s), 4 * w_desc.block_type.nbytes)
                for t in gl.static_range(2):
                    for j in gl.static_range(2):
                        row, col = _bf16_box(w_row, g_col0, k, K, N_OUT, t, j, GATED, PAIRS)
                        _tma_load(w_desc, [row, col], ready.index(s), w_s.index(s * 4 + 2 * t + j))
            it += n_steps


@gluon.jit
def _bf16_item_gemm(w_s, x_s, ready, empty, it, n_steps, rows_ptr, expert_ptr, n_pairs, N_OUT, N_ROWS, g_col0,
                    final_ptr, a_scale_ptr, expert_scale_ptr, bias_ptr, q_scale_ptr, alpha, beta, beta_lin, limit,
                    T: gl.constexpr, GATED: gl.constexpr, STAGES: gl.constexpr, NR: gl.constexpr, ACC_L: gl.constexpr,
                    A_SCALE: gl.constexpr, HAS_EXPERT_SCALE: gl.constexpr, HAS_BIAS: gl.constexpr,
                    INTERLEAVED: gl.constexpr, ACT: gl.constexpr, APPLY_ACT: gl.constexpr, HAS_LIMIT: gl.constexpr,
                    QUANT_NVFP4: gl.constexpr):
    """One work item of consumer warpgroup T over the block's first NR rows (rows_ptr: its sorted rows, expert_ptr:
    its expert): two [64 rows, NR pairs] accumulators (gated: its 64 outputs' gate and up rows; ungated: two 64-row
    tiles) from wgmma with both operands in shared memory, a step's two MMA groups in flight while the next step's
    issue (the slot before is released once they complete, the item's last slot after its final wait); then
    moe_gemm_kernel's epilogue from the accumulators (_direct_epilogue)."""
    acc_a = gl.zeros([64, NR], gl.float32, ACC_L)
    acc_b = gl.zeros([64, NR], gl.float32, ACC_L)
    for i in range(n_steps):
        s = (it + i) % STAGES
        mbarrier.wait(ready.index(s), ((it + i) // STAGES) & 1)
        fence_async_shared()  # the activation rows came by cp.async (generic proxy); wgmma reads them (async)
        xt = x_s.index(s).slice(0, NR).permute((1, 0))
        acc_a = warpgroup_mma(w_s.index(s * 4 + 2 * T), xt, acc_a, is_async=True)
        acc_b = warpgroup_mma(w_s.index(s * 4 + 2 * T + 1), xt, acc_b, is_async=True)
        acc_a, acc_b = warpgroup_mma_wait(2, deps=[acc_a, acc_b])  # the step before is complete
        mbarrier.arrive(empty.index((it + i + STAGES - 1) % STAGES), pred=i > 0)
    acc_a, acc_b = warpgroup_mma_wait(0, deps=[acc_a, acc_b])
    mbarrier.arrive(empty.index((it + n_steps - 1) % STAGES))  # the item's last slot
    if GATED:
        _direct_epilogue(acc_a, acc_b, rows_ptr, n_pairs, N_OUT, 0, _bf16_first_output(g_col0, T, 0, GATED), GATED, NR,
                         expert_ptr, final_ptr, a_scale_ptr, expert_scale_ptr, bias_ptr, q_scale_ptr, N_ROWS, alpha,
                         beta, beta_lin, limit, A_SCALE, HAS_EXPERT_SCALE, HAS_BIAS, INTERLEAVED, ACT, APPLY_ACT,
                         HAS_LIMIT, QUANT_NVFP4)
    else:
        _direct_epilogue(acc_a, acc_a, rows_ptr, n_pairs, N_OUT, 0, _bf16_first_output(g_col0, T, 0, GATED), GATED, NR,
                         expert_ptr, final_ptr, a_scale_ptr, expert_scale_ptr, bias_ptr, q_scale_ptr, N_ROWS, alpha,
                         beta, beta_lin, limit, A_SCALE, HAS_EXPERT_SCALE, HAS_BIAS, INTERLEAVED, ACT, APPLY_ACT,
                         HAS_LIMIT, QUANT_NVFP4)
        _direct_epilogue(acc_b, acc_b, rows_ptr, n_pairs, N_OUT, 0, _bf16_first_output(g_col0, T, 1, GATED), GATED, NR,
                         expert_ptr, final_ptr, a_scale_ptr, expert_scale_ptr, bias_ptr, q_scale_ptr, N_ROWS, alpha,
                         beta, beta_lin, limit, A_SCALE, HAS_EXPERT_SCALE, HAS_BIAS, INTERLEAVED, ACT, APPLY_ACT,
                         HAS_LIMIT, QUANT_NVFP4)


@gluon.jit
def _bf16_consumer(w_s, x_s, ready, empty, block_expert_ptr, block_short_ptr, n_blocks, n_items, K, sorted_rows_ptr,
                   n_pairs, N_OUT, N_ROWS, final_ptr, a_scale_ptr, expert_scale_ptr, bias_ptr, q_scale_ptr, alpha,
                   beta, beta_lin, limit, T: gl.constexpr, GATED: gl.constexpr, STAGES: gl.constexpr,
                   BM: gl.constexpr, BK: gl.constexpr, ACC_L: gl.constexpr, ACC_T: gl.constexpr,
                   GROUP_M: gl.constexpr, INLINE: gl.constexpr, A_SCALE: gl.constexpr,
                   HAS_EXPERT_SCALE: gl.constexpr, HAS_BIAS: gl.constexpr, INTERLEAVED: gl.constexpr,
                   ACT: gl.constexpr, APPLY_ACT: gl.constexpr, HAS_LIMIT: gl.constexpr, QUANT_NVFP4: gl.constexpr):
    """Consumer warpgroup T over the program's work items (as _bf16_producer's), each by _bf16_item_gemm: over BM
    rows, or INLINE (inline_tail_blocks' layout) over the first BM / 2 rows of a block flagged short (its rows
    there, padding after them: half the MMAs, ACC_T's accumulators)."""
    n_steps = gl.cdiv(K, BK)
    it = 0
    for w in range(gl.program_id(0), n_items, gl.num_programs(0)):
        pid_m, g_col0 = _bf16_item(w, n_blocks, N_OUT, GATED, GROUP_M)
        if gl.load(block_expert_ptr + pid_m) >= 0:
            rows_ptr = sorted_rows_ptr + pid_m * BM
            if INLINE and gl.load(block_short_ptr + pid_m) != 0:
                _bf16_item_gemm(w_s, x_s, ready, empty, it, n_steps, rows_ptr, block_expert_ptr + pid_m, n_pairs,
                                N_OUT, N_ROWS, g_col0, final_ptr, a_scale_ptr, expert_scale_ptr, bias_ptr, q_scale_ptr,
                                alpha, beta, beta_lin, limit, T, GATED, STAGES, BM // 2, ACC_T, A_SCALE,
                                HAS_EXPERT_SCALE, HAS_BIAS, INTERLEAVED, ACT, APPLY_ACT, HAS_LIMIT, QUANT_NVFP4)
            else:
                _bf16_item_gemm(w_s, x_s, ready, empty, it, n_steps, rows_ptr, block_expert_ptr + pid_m, n_pairs,
                                N_OUT, N_ROWS, g_col0, final_ptr, a_scale_ptr, expert_scale_ptr, bias_ptr, q_scale_ptr,
                                alpha, beta, beta_lin, limit, T, GATED, STAGES, BM, ACC_L, A_SCALE, HAS_EXPERT_SCALE,
                                HAS_BIAS, INTERLEAVED, ACT, APPLY_ACT, HAS_LIMIT, QUANT_NVFP4)
            it += n_steps


@gluon.jit
def bf16_prefill_kernel(w_desc, a_ptr, sorted_rows_ptr, block_expert_ptr, block_short_ptr, n_blocks, n_items, n_pairs,
                        a_row_div, N_OUT, N_ROWS, K, final_ptr, a_scale_ptr, expert_scale_ptr, bias_ptr, q_scale_ptr,
                        alpha, beta, beta_lin, limit, GATED: gl.constexpr, PAIRS: gl.constexpr, STAGES: gl.constexpr,
                        BM: gl.constexpr, BK: gl.constexpr, ACC_L: gl.constexpr, ACC_T: gl.constexpr, XS: gl.constexpr,
                        XL: gl.constexpr, PW: gl.constexpr, PREGS: gl.constexpr, SREGS: gl.constexpr,
                        GROUP_M: gl.constexpr, PERSIST: gl.constexpr, INLINE: gl.constexpr,
                        A_SCALE: gl.constexpr, HAS_EXPERT_SCALE: gl.constexpr,
                        HAS_BIAS: gl.constexpr, INTERLEAVED: gl.constexpr, ACT: gl.constexpr,
                        APPLY_ACT: gl.constexpr, HAS_LIMIT: gl.constexpr, QUANT_NVFP4: gl.constexpr):
    """moe_gemm_kernel's bf16 GEMM, n_items = n_blocks expert blocks (BM pairs each) x the GEMM's programs of 128
    outputs (gated: gate and up rows of each) or 256 (ungated), the whole K an item, written through its epilogue: a
    PW-warp producer partition streams each K step's weights (four [64, BK] TMA boxes) and activation rows (cp.async)
    into a STAGES-deep ring, two consumer warpgroups issue the wgmma from there (_bf16_consumer). The operands and
    the epilogue are moe_gemm_kernel's (block_expert -1: a padding block, nothing to do); GROUP_M orders the items in
    groups of expert blocks (grouped_tile_order); INLINE: inline_tail_blocks' blocks, those flagged in block_short_ptr
    computed over their first BM / 2 rows. The grid: one program an item, or PERSIST: fewer, each running the
    items program_id, + num_programs, ... on one ring (the next item's loads under the last one's MMAs and
    epilogue)."""
    go = True
    if not PERSIST:  # a padding block's program returns before it sets anything up
        go = gl.load(block_expert_ptr + _bf16_item(gl.program_id(0), n_blocks, N_OUT, GATED, GROUP_M)[0]) >= 0
    if go:
        w_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES * 4, 64, BK], w_desc.layout)
        x_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BM, BK], XS)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(STAGES):
            mbarrier.init(ready.index(s), count=32 * PW + 1)  # a cp.async arrive a producer thread, expect's
            mbarrier.init(empty.index(s), count=2)  # both consumer warpgroups release the slot
        gl.warp_specialize(
            [(_bf16_consumer, (w_s, x_s, ready, empty, block_expert_ptr, block_short_ptr, n_blocks, n_items, K,
                               sorted_rows_ptr, n_pairs, N_OUT, N_ROWS, final_ptr, a_scale_ptr, expert_scale_ptr,
                               bias_ptr, q_scale_ptr, alpha, beta, beta_lin, limit, 0, GATED, STAGES, BM, BK, ACC_L,
                               ACC_T, GROUP_M, INLINE, A_SCALE, HAS_EXPERT_SCALE, HAS_BIAS, INTERLEAVED, ACT,
                               APPLY_ACT, HAS_LIMIT, QUANT_NVFP4)),
             (_bf16_consumer, (w_s, x_s, ready, empty, block_expert_ptr, block_short_ptr, n_blocks, n_items, K,
                               sorted_rows_ptr, n_pairs, N_OUT, N_ROWS, final_ptr, a_scale_ptr, expert_scale_ptr,
                               bias_ptr, q_scale_ptr, alpha, beta, beta_lin, limit, 1, GATED, STAGES, BM, BK, ACC_L,
                               ACC_T, GROUP_M, INLINE, A_SCALE, HAS_EXPERT_SCALE, HAS_BIAS, INTERLEAVED, ACT,
                               APPLY_ACT, HAS_LIMIT, QUANT_NVFP4)),
             (_bf16_producer, (w_desc, a_ptr, sorted_rows_ptr, block_expert_ptr, n_blocks, n_items, n_pairs,
                               a_row_div, K, N_OUT, N_ROWS, w_s, x_s, ready, empty, GATED, PAIRS, STAGES, BM, BK, XL,
                               GROUP_M))],
            [4, PW], [SREGS, PREGS])


def launch_bf16_prefill(launcher, w, a, sorted_rows, block_expert, n_pairs: int, a_row_div: int, n_out: int,
                        n_rows: int, k_dim: int, gated: bool, interleaved: bool, direct: dict, stages: int, bm: int,
                        maxnreg: int, group_m: int = 0, persistent: int = 0, block_short=None,
                        producer: tuple = (4, 56)):
    """One launch of bf16_prefill_kernel through `launcher` (triton_kernels' attribute, for compile_check): w the
    GEMM's bf16 weights [E, n_rows, k_dim] (gated: gate and up halves, or interleaved rows), a its activation rows
    (pair // a_row_div), direct the epilogue's operands and flags (as launch_bitplace_partials' direct); bm pairs an
    expert block (64 or 128: the wgmma's N), stages the ring's depth, maxnreg the first consumer's registers (the
    second gets (3 maxnreg - producer registers) / 2, rounded down to 8), group_m the items' order, persistent 0 (a
    program an item) or that many programs, block_short None or inline_tail_blocks' flags (sorted_rows and
    block_expert of its layout: a short block's rows in its first bm / 2 slots), producer (warps, registers)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    e = w.shape[0]
    pairs = gated and interleaved
    if bm not in (64, 128) or stages < 2:
        raise ValueError(f"bm (pairs an expert block, the wgmma's N) 64 or 128 and stages >= 2; got bm {bm}, "
                         f"stages {stages}")
    if w.dtype != torch.bfloat16 or not w.is_contiguous() or w.shape[1:] != (n_rows, k_dim):
        raise ValueError(f"w: contiguous bf16 [E, {n_rows}, {k_dim}], got {w.dtype} {tuple(w.shape)}")
    # cp.async moves 16-byte runs (8 values) of an activation row, at offsets (row x K + k) that Triton proves 16-byte
    # aligned only for K a multiple of 16 (it marks integer arguments divisible by 16, no finer: K % 16 == 8 leaves
    # 2-byte copies, which cp.async refuses at compile time); interleaved rows as [E x N_OUT, 2 K] row pairs need
    # whole K steps, or a gate box's last step would read the up row's first values (multiplied by zeros, but never
    # read as weights)
    if k_dim % 16 or pairs and k_dim % BF16_BLOCK_K or n_rows < 64 or k_dim < BF16_BLOCK_K:
        raise ValueError(f"bf16_prefill_kernel takes K a multiple of 16 (of {BF16_BLOCK_K} with interleaved gate and "
                         f"up rows) and at least {BF16_BLOCK_K}, and at least 64 weight rows; got K {k_dim}, "
                         f"{n_rows} rows, interleaved {pairs}")
    warps, regs = producer
    second = (3 * maxnreg - regs) // 2 // 8 * 8
    check_partition_registers(maxnreg, 3, regs, second)
    view = w.view(e * n_out, 2 * k_dim) if pairs else w.view(e * n_rows, k_dim)
    w_desc = TensorDescriptor.from_tensor(view, [64, BF16_BLOCK_K], W_BF16_SMEM)
    x_load = gl.BlockedLayout([1, 8], [32 * 8 // BF16_BLOCK_K, BF16_BLOCK_K // 8], [warps, 1], [1, 0])
    acc_layout, half_layout = accumulator_layouts(bm)[0], accumulator_layouts(bm // 2)[0]
    n_blocks = block_expert.numel()
    n_items = n_blocks * -(-n_out // (BF16_GATED_OUTPUTS.value if gated else BF16_UNGATED_OUTPUTS.value))
    grid = (min(persistent, n_items) if persistent else n_items,)
    return launcher[grid](w_desc, a, sorted_rows, block_expert, block_expert if block_short is None else block_short,
                          n_blocks, n_items, n_pairs, a_row_div, n_out, n_rows, k_dim, GATED=gated, PAIRS=pairs,
                          STAGES=stages, BM=bm, BK=BF16_BLOCK_K, ACC_L=acc_layout, ACC_T=half_layout, XS=X_SMEM,
                          XL=x_load, PW=warps, PREGS=regs, SREGS=second, GROUP_M=group_m,
                          PERSIST=int(bool(persistent)), INLINE=int(block_short is not None), num_warps=4,
                          maxnreg=maxnreg, enable_fp_fusion=False, **direct)
