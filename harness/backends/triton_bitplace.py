"""triton_bitplace: FP4 weights (MXFP4, gpt-oss; NVFP4) decoded by bit placement (issue 15), with bf16 activations
(W4A16) or the activations that triton_emulation quantizes to exact bf16 values with a scale on the accumulator
(MXFP4/MXFP6 W4A4/W4A6, NVFP4 W4A4, static FP8 W4A8).

prepare() lays the codes out in the order of the wgmma register operand (mma_order_codes: in each 128-value
chunk of a row, the 32 codes one thread multiplies are 16 contiguous bytes, the two columns of each bf16x2
register 16 bits apart in a word) and the block scales in whole words per chunk (MX stored as the exponent field
of 2^(s - 1)); both are pure data movements with inverses (suites/test_fp4_bits.py). The kernel loads each row's
16 bytes with one 16-byte load per thread, places each E2M1 code's bits into a bf16 (value x 2^-126) two at a
time, and multiplies each bf16x2 by the block factor once: for MXFP4 2^(s - 1) (the 2^126 bias folded in), for NVFP4
the E4M3 block scale x 2^119 (the rest of the bias, 2^7, folded into the global scale on the accumulator). harness/backends/fp4_bits.py states
the contract and checks it for every byte and scale. The tile is the MMA's wide side (weights x tokens^T) and
its layout is already the operand's: no shared-memory round trip, no lookup, no integer-to-float conversion, no
NaN select. A checkpoint with an MX block scale above 2 (E8M0 > 128, where the fold would leave bf16), the NaN
scale 0xFF, or an NVFP4 NaN block scale falls back to triton_emulation's decode in the checkpoint's layout:
never a silent rounding. The rest of the pipeline is triton_emulation's. The CPU runs its fp32 twin under the
interpreter; the H200 runs passed the conformance suite (results/gpu-issue15/).
"""

from __future__ import annotations

import dataclasses
import os

import torch

from harness.platforms import triton_version
from reference.formats import E2M1
from reference.packing import pack_fp4, unpack_fp4
from reference.quantizers import FP8, MX, NVFP4

from .fp4_bits import E8M0_FOLDABLE_MAX
from . import triton_kernels
from .triton_emulation import (TILE_KEYS, TritonEmulationBackend, multiprocessors, split_k_to_fill,
                               table_row_matches)


# NVFP4 block factors by an exponent add where every scale of the checkpoint is a normal E4M3 number (triton_kernels.
# _nvfp4_factor_words' NORMAL): 16 SASS fewer a K step for Triton 3.6 on sm90 (gated Gluon tiles 434 -> 418,
# moe_gemm_kernel 531 -> 515, tools/count_loop_instructions.py at gpt-oss-120b 8 tokens); the same bits as the
# multiplies for every normal code (suites/test_fp4_bits.py, in torch). On the H200 (results/gpu-issue28/run-13):
# NVFP4 conformance and special values 72 passed, bit for bit against moe_gemm_kernel at 1 / 8 / 64 tokens, memcheck
# 0; NVFP4 decode 0-1.7% faster (Kimi-K2 8 tokens 508.0 -> 499.6 us). MOE_CONFORMANCE_NVFP4_EXPONENT_ADD=0: multiplies
NVFP4_EXPONENT_ADD = os.environ.get("MOE_CONFORMANCE_NVFP4_EXPONENT_ADD", "1") == "1"
# And where every scale is also positive (as every NVFP4 checkpoint writer's amax-based scales are), prepare() stores
# each E4M3 code s as s + 0x78 (NV_NORMAL 2, _NV_BIAS): (e + 15) << 3 | m, at most 0xF6, so that the factor's bf16 bits
# (e + 239) << 7 | m << 4 are the stored byte shifted by 4 with 0x7000 or'ed in, one shift and one and-or a word of
# two factors (triton_kernels._nvfp4_factor_halves) where the add took six or seven: 24 SASS fewer a K step again
# (Triton 3.6 for sm90: decode 482 -> 458, the Gluon decode GEMM 418 -> 394, the 8-warp prefill row 520 -> 496), and
# the and-or one three-input LOP3 since session 45 (_nv_biased_factor_pairs: 458 -> 443, 394 -> 379, 496 -> 481; its
# bits checked on an H100 in results/gpu-issue28/run-43, not yet timed), and since session 46 each stored word rotated
# left by 4 bits (_rotate_words_left_4): bytes 0 and 2 already 4 bits up, bytes 1 and 3 one funnel rotate away, 8 SASS
# fewer again (481 -> 473, 443 -> 435, 379 -> 371; not yet run on a GPU). The biased codes ran in session 45's bench
# on an H100 before that (conformance passed:
# results/gpu-issue28/run-35/session45-h100), their A/B not yet timed (run-42); MOE_CONFORMANCE_NVFP4_BIASED_SCALES=0
# keeps the codes as they are.
NVFP4_BIASED_SCALES = os.environ.get("MOE_CONFORMANCE_NVFP4_BIASED_SCALES", "1") == "1"
# The decode row's split-K tiles finished in the GEMM's own launch by their last split (the tile key serial_k:
# moe_gemm_kernel's SERIAL_K, the Gluon kernel's SERIAL), one launch fewer (GEMM1's splitk_epilogue_kernel). On the
# H200 (results/gpu-issue28/run-22): bit for bit with serial_k 0 on both kernels and models, 1 and 8 tokens, MXFP4 and
# NVFP4 W4A4, memcheck and synccheck clean; no faster at one token (gpt-oss-120b MXFP4 35.8 -> 36.2 us, W4A4 44.1 ->
# 43.1, Kimi-K2 91.8 -> 90.6: within a run's noise) and slower for NVFP4 W4A4 from 8 tokens on (gpt-oss-120b 150.9 ->
# 161.6 us, 570.5 -> 622.6; Kimi-K2 2369 -> 2466): the chain's launches, overlapped by PDL, were not what cost the
# time. Opt-in; MOE_CONFORMANCE_SERIAL_K=1 turns it on for the decode rows.
SERIAL_K = os.environ.get("MOE_CONFORMANCE_SERIAL_K", "0") == "1"

# (max pairs, tiles), first match wins: the H200 sweep of tools/tune_moe.py (BENCHMARKS.md "Issue 28";
# results/gpu-issue28/run-2, both code layouts, 1 / 8 / 64 tokens, gpt-oss-120b and Kimi-K2 MXFP4). Decode (up to
# 1024 pairs): 64 rows (32 row pairs) x 16 pairs, 4 warps, 3 stages, K split until GEMM1 has 512 programs
# (split_k_to_fill: one token splits 4 ways on gpt-oss, 2 on Kimi-K2; 8 tokens and more not at all). 128-row
# tiles, 4 stages, 8 warps (two warpgroups on one activation tile, 128 or 256 rows), mma_steps 2 and maxnreg 96 were
# slower or no faster at every point. Prefill (results/gpu-issue28/run-14, 8192 tokens): the tiles in groups of 8 row
# blocks (group_m; MXFP4 gpt-oss-120b 35.1 -> 42.3% of dense bf16, Kimi-K2 36.0 -> 41.4%); 128 rows a tile won the
# MXFP4 sweep on gpt-oss-120b (45.9%) but lost NVFP4 (W4A4 35.4 -> 27.1%, Kimi-K2 37.6 -> 29.6%) in make bench:
# padding, Kimi-K2's 171 rows an expert fill 67% of two 128-row blocks. With tail_m 64 (each expert's rows in 128-row
# blocks and one 64-row tail block, split_tail_blocks): MXFP4 in make bench (results/gpu-issue28/run-17) 40.1 -> 46.5%
# (gpt-oss-120b), 41.6 -> 45.6% (Kimi-K2). The tail by the mean rows an expert (fit_tail_m: 32 for gpt-oss-120b's 256,
# 4246 -> 4143 us in run-19; 64 for Kimi-K2's 171, where 32 was 15957 -> 17210 us); a 64-row tail in the GEMM's one
# launch (inline_tails, where the fit is half a block: Kimi-K2 16122 -> 15895 us, results/gpu-issue28/run-23
# PART=inline; gpt-oss-120b's 32-row tails stay a second launch, 4129 us against 4224 us inline at 64). Not taken for
# MXFP4 (results/gpu-issue28/run-19, run-20/wide): 2 or 4 stages, mma_steps 2, 128 weight rows a program on two
# warpgroups (8 warps: Kimi-K2 15451 -> 15175 us, gpt-oss-120b 4135 -> 4441), a persistent grid (2x slower).
# NVFP4 W4A16 (results/gpu-issue28/run-27 PART=nvfp4, run-28 PART=stages, tune_moe sustained at 8192 tokens): at
# MXFP4's 128 rows and 4 warps GEMM1 takes 114.0 KB of shared memory at 3 stages (its E4M3 scales are twice MXFP4's
# bytes), 1 KB over what lets two programs share a multiprocessor (MXFP4: 113.0 KB, 2 programs/SM), so one runs; 128
# weight rows on 8 warps spend that one program's shared memory on twice the MMA work: gpt-oss-120b 5620 (64 rows)
# -> 5138 (128 rows, 4 warps) -> 4690 us (8 warps), Kimi-K2 18992 -> 18679 -> 17075 us; 2 stages (73 KB, 2 programs)
# 5129 / 19561 us; inline tails slower (these tiles with 64-row tails compiled on the H200 in run-20/wide: conformance
# and special values of MXFP4 and NVFP4 at every size, 106 passed, 3 skipped, none failed). NVFP4 W4A4 takes the same
# row since GEMM1's epilogue computes GEMM2's NVFP4 input by _round_to_format (8952 -> 7616 SASS at 128 rows): before,
# 8 warps lost on gpt-oss-120b (5598 -> 6157 us, run-28) and W4A4 ran on 64-row tiles; after (results/gpu-issue28/run-30
# PART=w4a4, an H100, one sweep): 64 rows 5747 -> 128 rows on 8 warps 4891 us (gpt-oss-120b, 32-row tails), Kimi-K2
# 19082 -> 17196 (64-row tails); quantizing in its own launch (quant_launch 1) 4877 / 17974 then, with the 16 x 16
# quantizer programs; with the values-only 32 x 128 ones (_nvfp4_values: GEMM1's input 100.4 -> 48 us) 4735.0 -> 4478.9
# us and 15951.4 -> 15527.3 (results/gpu-issue28/run-38, an H100: GEMM1 2623 -> 2223 us, GEMM2's input 168 us in its
# own launch), so the NVFP4 rows take quant_launch 1 (W4A16 ignores it; the 4-warp row, not timed, holds a
# multiprocessor alone too). (At 128 rows by TMA its
# activations raced when compiled, run-17 to run-23: refused, _gemm.) (max pairs, kinds or None, tiles; triton_emulation.table_row_matches).
# The 8-warp row only where Triton compiles it as measured: Triton 3.9 (CI's) gives the 8-warp bit-placement loop a
# zero-step path that zeroes the accumulators before the last wgmma wait, and ptxas then serializes every wgmma of
# the kernel (its warning C7515; suites/test_triton_helpers.py), where 3.6 (the H200 image's) does not; there the
# 4-warp 128-row row (not serialized by either; run-28: 5138 / 18679 us, W4A4 5504 on run-30's H100).
EIGHT_WARP_BITPLACE_TRITON = (3, 6)


def env_tiles(name: str) -> dict[str, int]:
    """Tile keys from the environment variable `name` ("key=int,key=int"; unset or empty: none), each a launch
    parameter (triton_emulation.TILE_KEYS), for A/B runs of a table row in make bench without an edit (the bench
    report lists the variables in force); a key the row has is overridden."""
    text = os.environ.get(name, "").strip()
    try:
        tiles = {k.strip(): int(v) for k, v in (item.split("=", 1) for item in text.split(",") if item.strip())}
    except ValueError:
        raise ValueError(f"{name} takes key=int pairs separated by commas, got {text!r}") from None
    unknown = sorted(set(tiles) - set(TILE_KEYS))
    if unknown:
        raise ValueError(f"{name}: unknown launch parameters {unknown}; expected some of {TILE_KEYS}")
    return tiles


def env_int(name: str, default: int) -> int:
    """An integer switch from the environment (unset: default), its error naming the variable."""
    text = os.environ.get(name, str(default))
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name} takes an integer, got {text!r}") from None


# MOE_CONFORMANCE_NVFP4_PREFILL_TILES: keys added to both NVFP4 prefill rows (run-40's candidate:
# "tail_warps=4,tail_block_n=64")
_NVFP4_PREFILL_EXTRA = env_tiles("MOE_CONFORMANCE_NVFP4_PREFILL_TILES")
BITPLACE_TILES = (
    (1024, None, dict(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=3, split_k_programs=512)),
    (1 << 62, (NVFP4,), {**dict(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=3, group_m=8,
                                fit_tail_m=1, quant_launch=1), **_NVFP4_PREFILL_EXTRA}),
    (1 << 62, (NVFP4,), {**dict(block_m=128, block_n=64, block_k=128, num_warps=4, num_stages=3, group_m=8,
                                fit_tail_m=1, quant_launch=1), **_NVFP4_PREFILL_EXTRA}),
    (1 << 62, None, dict(block_m=128, block_n=64, block_k=128, num_warps=4, num_stages=3, group_m=8, fit_tail_m=1,
                         inline_tails=1)),
)


class TritonBitplaceBackend(TritonEmulationBackend):
    name = "triton_bitplace"
    # Rows stored in pairs, chunk by chunk (pair_rows), so that each load of codes and scales is whole 128-byte
    # lines, as triton_kernels' Hopper layout does (issue 28). In one H200 sweep (results/gpu-issue28/run-2) 13-20%
    # faster at 8 and 64 tokens and 5-16% at one token, at the same tiles, on both models;
    # MOE_CONFORMANCE_BITPLACE_ROW_PAIRS=0 stores rows one by one (the layout before, for A/B runs).
    row_pairs = os.environ.get("MOE_CONFORMANCE_BITPLACE_ROW_PAIRS", "1") == "1"
    # MOE_CONFORMANCE_BITPLACE_GLUON=1: MXFP4 x bf16 GEMMs at decode (16-pair blocks) by the warp-specialised Gluon
    # kernel (harness/backends/gluon_kernels.py: TMA producer warp, decoding warpgroup), compiled, rows in pairs;
    # the registered triton_bitplace_gluon always (10-13% faster on the H200, results/gpu-issue28/run-8). Off here:
    # triton_bitplace stays the plain-Triton path, the A/B baseline and the fallback where Gluon cannot run.
    gluon = os.environ.get("MOE_CONFORMANCE_BITPLACE_GLUON", "0") == "1"

    def supports(self, problem, platform) -> tuple[bool, str]:
        w, act = problem.scheme.weight, problem.scheme.act
        if w is None or not (w.kind is NVFP4 or w.kind is MX and w.elem is E2M1):
            return False, "bit-placement path: MXFP4 or NVFP4 weights only"
        if act is not None and act.kind is FP8 and not act.static:
            # the activation scale per token and 128 columns would multiply each K step's partial product
            return False, "bit-placement path: activations bf16, MX, NVFP4 or static FP8 (scales on the accumulator)"
        return super().supports(problem, platform)

    def tile_config(self, n_pairs: int, weight_kind, act_kind=None) -> dict:
        # the kernel's K step is one 128-value chunk and its N tile a multiple of 64 rows per warpgroup (the layout
        # of its loads is the wgmma register operand's): 4 warps, or 8 (two warpgroups on one activation tile, as
        # triton_kernels' Hopper tiles: 128 or 256 rows; compiled for sm90 the loop is the 4-warp one per warp,
        # results/cpu-issue28/README.md); from the H200 sweep (tools/tune_moe.py)
        if self.tiles is not None:
            warps = 8 if self.tiles.get("num_warps") == 8 else 4
            rows = 16 * warps  # 64 rows a warpgroup, repeated a power of two times (the kernel's REPS)
            fit = lambda n: rows * 2 ** max(0, (n // rows).bit_length() - 1)  # noqa: E731
            tiles = dict(self.tiles, block_k=128, block_n=fit(self.tiles["block_n"]), num_warps=warps)
            if tiles.get("w2_block_n"):
                tiles["w2_block_n"] = fit(tiles["w2_block_n"])
            tail_rows = 16 * (tiles.get("tail_warps") or warps)
            if tiles.get("tail_warps") not in (None, 0, 4, 8) or (tiles.get("tail_block_n") or tail_rows) % tail_rows:
                raise ValueError(f"the bit-placement tail launch takes 4 or 8 warps and an N tile of 64 rows a "
                                 f"warpgroup repeated: tail_warps {tiles.get('tail_warps')}, tail_block_n "
                                 f"{tiles.get('tail_block_n')} (a multiple of {tail_rows})")
            return tiles
        if triton_kernels.INTERPRET:
            return dict(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=2)
        eight_warps = triton_version() <= EIGHT_WARP_BITPLACE_TRITON
        for max_pairs, kinds, cfg in BITPLACE_TILES:
            if cfg["num_warps"] == 8 and not eight_warps:
                continue
            if n_pairs <= max_pairs and table_row_matches(kinds, weight_kind, act_kind):
                return dict(cfg, **({"serial_k": 1} if SERIAL_K and cfg["block_m"] == 16 else {}))
        raise AssertionError("BITPLACE_TILES ends with a catch-all row")

    def prepare(self, ckpt):
        prep = super().prepare(ckpt)
        scales = [getattr(ckpt, n).scale for n in ("w13", "w2")]
        mx = ckpt.scheme.weight.kind is MX
        if mx:
            # the fold 2^(s - 1) is a bf16 power of two for s <= 128; 0xFF (NaN) is no power of two at all
            exact = all(int(s.max()) <= E8M0_FOLDABLE_MAX for s in scales)
        else:  # NVFP4: E4M3 block scales decode exactly to bf16, but not the NaN codes 0x7F / 0xFF
            exact = not any(bool(((s & 0x7F) == 0x7F).any()) for s in scales)
        if not exact:
            return dataclasses.replace(prep, constexprs=dict(BITPLACE=False))
        block = 32 if mx else 16
        # NVFP4's factors by an integer add where every E4M3 scale is normal (no zero, no subnormal; NV_NORMAL 1),
        # from biased codes where every one is positive too (NV_NORMAL 2)
        nv_normal = 0
        if NVFP4_EXPONENT_ADD and not mx and all(bool(((s & 0x78) != 0).all()) for s in scales):
            nv_normal = 2 if NVFP4_BIASED_SCALES and all(int(s.max()) < 0x80 for s in scales) else 1
        nv_bias = _NV_BIAS if nv_normal == 2 else 0
        laid = dict(w13=mma_order_codes(ckpt.w13.data), w2=mma_order_codes(ckpt.w2.data),
                    w13_scale=bitplace_scales(scales[0], mx, 128 // block, nv_bias),
                    w2_scale=bitplace_scales(scales[1], mx, 128 // block, nv_bias))
        if self.row_pairs:
            act = ckpt.activation
            halves = act.gated and act.interleaved  # the kernel then reads gate rows, then up rows
            chunk_bytes = dict(w13=64, w2=64, w13_scale=128 // block, w2_scale=128 // block)
            laid = {k: pair_rows(deinterleave_rows(v) if halves and k.startswith("w13") else v, chunk_bytes[k])
                    for k, v in laid.items()}
        laid = {k: v.to(self.device) for k, v in laid.items()}
        if not mx:  # the kernel's NVFP4 weights are value x 2^-7 (triton_kernels._fp4_bitplace_tile): an exact
            # power of two on the per-expert global scale, applied to the fp32 accumulator (the same roundings)
            laid.update(w13_expert_scale=prep.w13_expert_scale * _NVFP4_FOLD, w2_expert_scale=prep.w2_expert_scale
                        * _NVFP4_FOLD)
        extras = {}
        if self.gluon and self.row_pairs and not triton_kernels.INTERPRET and (mx or GLUON_NVFP4):
            from .gluon_kernels import scales_by_chunk

            per_chunk = 128 // block  # scale bytes a row and chunk: 4 MX, 8 NVFP4
            extras = {f"{k}_by_chunk": scales_by_chunk(laid[k], laid[k].shape[1], laid[k].shape[2] // per_chunk,
                                                       per_chunk) for k in ("w13_scale", "w2_scale")}
            if GLUON_TILE_MAJOR or (self.tiles or {}).get("tile_major"):
                # (a second copy of the weights: the A/B's, while the prefill path reads pair rows)
                from .gluon_kernels import tile_major_codes, tile_major_scales

                extras.update({f"{k}_tile_major": (tile_major_codes(laid[k]), tile_major_scales(laid[f"{k}_scale"],
                                                                                                 per_chunk))
                               for k in ("w13", "w2") if laid[k].shape[1] % 64 == 0})
        constexprs = dict(BITPLACE=True, ROW_PAIRS=self.row_pairs)
        if nv_normal:  # the factors by an integer add (triton_kernels._nvfp4_factor_halves), fewer instructions
            constexprs["NV_NORMAL"] = True if nv_normal == 1 else nv_normal
        return dataclasses.replace(prep, constexprs=constexprs, extras=extras, **laid)

    def _partials_kernel(self, prep, which, a_mode, tiles, quantize_nvfp4, n_out, n_rows, k_dim):
        if prep.ckpt.scheme.weight is None:  # bf16 weights: triton_emulation's (the tiles' gluon_bf16)
            return super()._partials_kernel(prep, which, a_mode, tiles, quantize_nvfp4, n_out, n_rows, k_dim)
        scales = prep.extras.get(f"{which}_scale_by_chunk")
        # the Gluon kernel's contract: activations exactly bf16 (a_mode 0, or 1 with GLUON_QUANTIZED_ACT: one fp32
        # scale that the epilogue kernel applies to the sums, as it does after moe_gemm_kernel's split-K partials; so
        # too GEMM1's NVFP4 quantization of GEMM2's input), 16-pair blocks, TMA strides of whole 16 bytes
        # (scale rows of n_rows x 4 bytes), 16-byte activation rows for cp.async, gate and up rows in whole pairs
        # (n_rows >= 64: every TMA box lies within its tensor's extent on the smallest test models too; with two
        # 64-row tiles a program (block_n 128) the last program's second tile may lie past N_OUT, where TMA fills
        # zeros and no row is stored), one or two warpgroups' tiles of 4 warps each
        block_n = tiles.get(f"{which}_block_n") or tiles["block_n"]
        nvfp4 = prep.ckpt.scheme.weight.kind is NVFP4
        scaled = a_mode != 0 or quantize_nvfp4 is not None or prep.ckpt.scheme.act is not None
        # prefill blocks (the tiles' gluon_prefill): block_m pairs a block as the wgmma's N, whole K a program, the
        # epilogue from the accumulators (direct), a 4-warp producer (one warp holding 64 rows' addresses spills)
        bm = tiles["block_m"]
        prefill = bool(tiles.get("gluon_prefill")) and bm in (32, 64, 128) and (tiles.get("split_k") or 1) == 1
        if (scales is None or a_mode not in (0, 1) or scaled and not GLUON_QUANTIZED_ACT or bm != 16 and not prefill
                or n_rows % 4
                or n_rows < 64 or k_dim % 16 or n_out % 2 or block_n not in (64, 128) or tiles["num_warps"] != 4
                or nvfp4 and (n_rows % 32 or n_out % 32)):  # NVFP4: a tile's 512 scale bytes as 256-byte box rows
            return None
        from .gluon_kernels import launch_bitplace_partials

        codes = getattr(prep, which)

        # the ring's depth and the launch's register cap from the tiles (tools/tune_moe.py sweeps them)
        stages, maxnreg = max(2, tiles["num_stages"]), tiles.get("maxnreg") or GLUON_MAXNREG
        overlap = tiles.get(f"{which}_mma_overlap", tiles.get("mma_overlap", GLUON_OVERLAP))  # GEMM2's may differ
        per_program = block_n // 64  # 64-row tiles a program: one consumer warpgroup each
        # programmatic dependent launch (triton_kernels.PDL_ORDER): GEMM1 waits at entry; GEMM2 prefetches its
        # weights into L2 first (the tiles' pdl 1) or waits at entry too (pdl 2: the launches overlap, no prefetch)
        pdl = (1 if which == "w13" or tiles["pdl"] == 2 else 2) if tiles.get("pdl") else 0
        # a persistent grid (the tiles' persistent 1, schedule 0): as many programs as fit on the GPU at once
        persistent = tiles.get("persistent") and overlap == 0

        # GEMM1 at most 16 tokens (the tiles' w13_prefetch: K chunks a program): its first chunks of weights into L2
        # before its wait for the routing launch, its block's expert ranked from the expert ids (PDL 3)
        prefetch_chunks = tiles.get("w13_prefetch") if which == "w13" and pdl == 1 and not persistent else 0

        # the tile-major copy of the weights (GLUON_TILE_MAJOR) where this GEMM's rows are whole 64-row tiles
        tile_major = prep.extras.get(f"{which}_tile_major") if tiles.get("tile_major") and not persistent else None

        prefill_args = {}
        if prefill:
            # registers: the producer warpgroup 56, two consumers share the rest of the launch's cap (multiples of 8;
            # one consumer takes it all: the second's figure is then unused)
            prefill_args = dict(bm=bm, producer=(4, 56, (3 * maxnreg - 56) // 2 // 8 * 8),
                                group_m=tiles.get("group_m") or 0)

        def run(a, partials, sorted_rows, block_expert, n_pairs, a_row_div, n_out, n_rows, k_dim, gated, split_k,
                serial=None, ids=None, direct=None):
            if a.data_ptr() % 16 or a.stride() != (k_dim, 1):  # cp.async moves 16-byte runs of whole rows: a view
                a = a.clone(memory_format=torch.contiguous_format)  # at an odd offset goes through a fresh copy
            return launch_bitplace_partials(triton_kernels.bitplace_partials_kernel, codes, scales, a, partials,
                                            sorted_rows, block_expert, n_pairs, a_row_div, n_out, n_rows, k_dim,
                                            gated, split_k, stages, maxnreg, overlap, per_program,
                                            1 + int(prep.constexprs.get("NV_NORMAL", 0)) if nvfp4 else 0, pdl,
                                            gluon_programs_at_once(block_n, maxnreg, stages, gated, nvfp4,
                                                                   multiprocessors(a.device)) if persistent else 0,
                                            **({"serial": serial} if serial else {}),
                                            **({"prefetch": (ids, prefetch_chunks)}
                                               if prefetch_chunks and ids is not None and a.shape[0] <= 16 else {}),
                                            **({"tile_major": tile_major}
                                               if tile_major and not (gated and n_out % 64) else {}),
                                            **({"direct": direct} if direct else {}), **prefill_args)
        run.direct = prefill  # the outputs from the accumulators: no partial sums, no epilogue launch after
        return run


# The stored order of one 128-value chunk of a row: code n = 4 i0 + 2 i2 + i1 of word 4t + q holds column 32q +
# 16 i2 + 8 i1 + 2t + i0, so thread-group t of a wgmma register operand (columns 16j + 2t + {0, 1, 8, 9}, j = 2q +
# i2) finds its 32 codes in 16 contiguous bytes, and the two columns of each bf16x2 register (i0 = 0, 1) sit 16
# bits apart in one word. As a view: column dims (q, i2, i1, t, i0) of sizes (4, 2, 2, 4, 2), stored as
# (t, q, i0, i2, i1).
_CHUNK = 128
_COLUMN_DIMS = (4, 2, 2, 4, 2)
_STORED_FROM_COLUMNS = (3, 0, 4, 1, 2)
# Inside a word the codes are not nibbles: the bits (m, e0, e1, sign) of code n = 4 i0 + p (pair p = 2 i2 + i1) sit
# at CODE_BITS[p] + 16 i0. Pairs 0, 1 and 2 are then bf16x2 bit patterns (sign at 15 / 31, magnitude at 6..8 /
# 22..24) after a left shift by 0, 3 and 6 and one AND; pair 3 takes three shifts (no fourth disjoint position
# set with one shift exists). 11 integer operations per 8 codes instead of 15 for nibbles
# (triton_kernels._place_pairs; suites/test_fp4_bits.py checks every code at every position).
CODE_BITS = ((6, 7, 8, 15), (3, 4, 5, 12), (0, 1, 2, 9), (10, 11, 13, 14))


def _scatter_bits(codes: torch.Tensor) -> torch.Tensor:
    """codes [..., 8] (n = 4 i0 + p) -> int64 words [...] with each code's bits at CODE_BITS[p] + 16 i0."""
    c = codes.to(torch.int64)
    word = torch.zeros(codes.shape[:-1], dtype=torch.int64, device=codes.device)
    for n in range(8):
        for bit, pos in enumerate(CODE_BITS[n % 4]):
            word |= ((c[..., n] >> bit) & 1) << (pos + 16 * (n // 4))
    return word


def word_codes(stored: torch.Tensor) -> torch.Tensor:
    """Bytes of stored words [..., 4 W] -> their codes [..., W, 8] (n = 4 i0 + p): _scatter_bits inverted."""
    word = stored.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    codes = torch.zeros(*word.shape, 8, dtype=torch.int64, device=stored.device)
    for n in range(8):
        for bit, pos in enumerate(CODE_BITS[n % 4]):
            codes[..., n] |= ((word >> (pos + 16 * (n // 4))) & 1) << bit
    return codes.to(torch.uint8)


def mma_order_codes(packed: torch.Tensor) -> torch.Tensor:
    """Packed E2M1 codes [E, N, K / 2] (two per byte, low nibble first) -> [E, N, ceil(K / 128) * 64] bytes in the
    kernel's order: each row padded with zero codes to whole 128-value chunks, the codes of each chunk permuted
    (the order above) and their bits placed in 32-bit words (CODE_BITS). A pure data movement;
    natural_order_codes inverts it."""
    if packed.dtype != torch.uint8 or packed.dim() != 3:
        raise TypeError(f"packed must be uint8 [E, N, K / 2], got {packed.dtype} {tuple(packed.shape)}")
    e, n, half = packed.shape
    chunks = -(-2 * half // _CHUNK)
    out = torch.empty(e, n, chunks * _CHUNK // 2, dtype=torch.uint8, device=packed.device)
    step = max(1, (1 << 24) // max(1, n * chunks * _CHUNK))  # experts per pass: ~16M codes (int64 words: ~130 MB)
    for e0 in range(0, e, step):
        part = packed[e0:e0 + step]
        codes = torch.zeros(part.shape[0], n, chunks * _CHUNK, dtype=torch.uint8, device=packed.device)
        codes[..., :2 * half] = unpack_fp4(part)
        codes = codes.view(-1, n, chunks, *_COLUMN_DIMS).permute(0, 1, 2, *(3 + d for d in _STORED_FROM_COLUMNS))
        words = _scatter_bits(codes.reshape(-1, n, chunks * _CHUNK // 8, 8))
        out[e0:e0 + step] = words.to(torch.int32).view(torch.uint8).reshape(-1, n, chunks * _CHUNK // 2)
    return out


def natural_order_codes(stored: torch.Tensor, k: int) -> torch.Tensor:
    """The inverse of mma_order_codes: [E, N, K / 2] packed codes in column order, the padding dropped."""
    e, n, half = stored.shape
    chunks = 2 * half // _CHUNK
    dims = [_COLUMN_DIMS[d] for d in _STORED_FROM_COLUMNS]
    inverse = [_STORED_FROM_COLUMNS.index(d) for d in range(5)]
    codes = word_codes(stored).view(e, n, chunks, *dims).permute(0, 1, 2, *(3 + d for d in inverse))
    return pack_fp4(codes.reshape(e, n, chunks * _CHUNK)[..., :k].contiguous())


def deinterleave_rows(t: torch.Tensor) -> torch.Tensor:
    """[E, 2n, ...] rows (gate, up, gate, up, ..) -> the gate rows, then the up rows. A pure data movement."""
    return torch.cat([t[:, 0::2], t[:, 1::2]], dim=1).contiguous()


def pair_rows(t: torch.Tensor, chunk_bytes: int) -> torch.Tensor:
    """[E, N, chunks * chunk_bytes] bytes per row (per 128-value chunk: 64 of codes, 4 or 8 of scales) -> the same
    bytes with rows 2m and 2m + 1 side by side chunk by chunk ([E, N / 2, chunks, 2, chunk_bytes] flattened back
    to [E, N, chunks * chunk_bytes]). A pure data movement; unpair_rows inverts it."""
    e, n, width = t.shape
    if n % 2 or width % chunk_bytes:
        raise ValueError(f"pair_rows needs an even number of rows and whole chunks, got {tuple(t.shape)} "
                         f"with {chunk_bytes}-byte chunks")
    return t.view(e, n // 2, 2, width // chunk_bytes, chunk_bytes).transpose(2, 3).reshape(e, n, width).contiguous()


def unpair_rows(t: torch.Tensor, chunk_bytes: int) -> torch.Tensor:
    """The inverse of pair_rows."""
    e, n, width = t.shape
    return t.view(e, n // 2, width // chunk_bytes, 2, chunk_bytes).transpose(2, 3).reshape(e, n, width).contiguous()


def bitplace_scales(scales: torch.Tensor, mx: bool, per_chunk: int, nv_bias: int = 0) -> torch.Tensor:
    """Block scales [E, N, K / block] (uint8) in the kernel's layout: each row padded with zero bytes to whole
    128-value chunks (per_chunk scales each: 4 for MX, 8 for NVFP4; whole 32-bit words), MX scales stored as
    s + 126 (the bf16 exponent field of 2^(s - 1), s <= 128), NVFP4 E4M3 codes as they are, or plus nv_bias
    (_NV_BIAS: positive normal codes only, 0x08-0x7E) with each 32-bit word then rotated left by 4 bits
    (_rotate_words_left_4). A pure data movement and a byte offset; unbitplace_scales inverts it."""
    if scales.dtype != torch.uint8 or scales.dim() != 3:
        raise TypeError(f"scales must be uint8 [E, N, K / block], got {scales.dtype} {tuple(scales.shape)}")
    if mx and int(scales.max()) > E8M0_FOLDABLE_MAX:
        raise ValueError(f"E8M0 scales above {E8M0_FOLDABLE_MAX} do not fold into one bf16 factor")
    if nv_bias and (mx or not bool(((scales >= 0x08) & (scales <= 0x7E)).all())):
        raise ValueError("nv_bias takes NVFP4 scales that are all positive normal E4M3 codes (0x08-0x7E)")
    width = -(-scales.shape[2] // per_chunk) * per_chunk
    out = torch.zeros(*scales.shape[:2], width, dtype=torch.uint8, device=scales.device)
    out[..., :scales.shape[2]] = scales + (_MX_FOLD if mx else nv_bias)
    return _rotate_words_left_4(out) if nv_bias else out


def unbitplace_scales(words: torch.Tensor, blocks: int, mx: bool, nv_bias: int = 0) -> torch.Tensor:
    """The inverse of bitplace_scales: the first `blocks` bytes of each row, MX exponents back to E8M0 codes."""
    s = (_rotate_words_right_4(words) if nv_bias else words)[..., :blocks]
    return (s - (_MX_FOLD if mx else nv_bias)).contiguous()


def _rotate_words_left_4(b: torch.Tensor) -> torch.Tensor:
    """Bytes [..., 4 w] as little-endian 32-bit words, each rotated left by 4 bits: byte i becomes
    b[i] << 4 | b[i - 1] >> 4 (byte 3's high nibble wraps into byte 0). NV_NORMAL 2's stored words: bytes 0 and 2 then
    sit at bits 4-11 and 20-27, where the factor word of blocks 0 and 2 wants them (no shift); bytes 1 and 3 reach them
    by one 8-bit rotate (triton_kernels._nvfp4_factor_halves)."""
    w = b.view(*b.shape[:-1], b.shape[-1] // 4, 4)
    return ((w << 4) | (w.roll(1, dims=-1) >> 4)).view(b.shape)


def _rotate_words_right_4(b: torch.Tensor) -> torch.Tensor:
    """The inverse of _rotate_words_left_4."""
    w = b.view(*b.shape[:-1], b.shape[-1] // 4, 4)
    return ((w >> 4) | (w.roll(-1, dims=-1) << 4)).view(b.shape)


_MX_FOLD = 126  # 2^(s - 1) = 2^(s - 127) x 2^126: the E2M1 placement's bias, folded into the scale's exponent
# NV_NORMAL 2's stored codes: s + 0x78 = (e + 15) << 3 | m, whose bits 4 up with 0x7000 or'ed in are the bf16 bits of
# s x 2^119 (exponent field e + 239 = 224 + (e + 15), no carry: e + 15 < 32)
_NV_BIAS = 0x78
_NVFP4_FOLD = 2.0**7  # NVFP4 weights decode to value x 2^-7 (the E4M3 factor x 2^119 replaces a x 2^126 per pair)


# the Gluon kernel's ring at decode (H200 sweeps, results/gpu-issue28/run-7 and run-8: 3 and 6 slower or no faster
# from 8 tokens on; a deeper ring wherever it added no wave, 5 or 6 slots, was 1-15% slower at every point of make
# bench, run-8 ring; both before the tile-major copy). MOE_CONFORMANCE_GLUON_STAGES=N for A/B runs
GLUON_STAGES = env_int("MOE_CONFORMANCE_GLUON_STAGES", 4)
# its split-K rule at decode: at one token gpt-oss-120b's 180 GEMM1 programs ran fastest split 2 ways (38.6 us
# against 44.2 unsplit and 44.5 split 4), Kimi-K2's 256 unsplit (95.1 us against 102.8 split 2) (run-7's sweep)
GLUON_SPLIT_K_PROGRAMS = 256
# its launch's register cap: the 1-warp producer is padded to a warpgroup, so 80 x 256 threads, 3 programs a
# multiprocessor; setmaxnreg gives the consumer warpgroup 120 in the K loop (136 in the epilogue), the producer
# 40 (24 idle): no spills (64 fits 4 programs, the consumer's loop at 88: tools/tune_moe.py sweeps both;
# MOE_CONFORMANCE_GLUON_MAXNREG=64 for A/B runs of make bench)
GLUON_MAXNREG = env_int("MOE_CONFORMANCE_GLUON_MAXNREG", 80)
# the consumer's schedule (gluon_kernels._consumer): 0 each step waits for its MMAs, the up tile decoded under the
# gate tile's; 1 both tiles decoded first (GEMM2, ungated: two K steps an iteration, two independent decode chains,
# 365 SASS per two steps against 188 a step at gpt-oss-120b's sizes, counted for sm90); 2 as 1 with a step's MMAs
# running on under the next step's decode. 0 fastest at 5 of 6 points of run-8's sweep (both GEMMs alike), and for
# GEMM2 alone at every point of run-9's tune-w2 (its paired schedule 1 was 1-6% slower)
# (MOE_CONFORMANCE_GLUON_OVERLAP: another default, for A/B runs of the suites and sanitizers)
GLUON_OVERLAP = int(os.environ.get("MOE_CONFORMANCE_GLUON_OVERLAP", "0"))
# its rows a program at decode: 64 (one consumer warpgroup) or 128 (two on one ring: bit for bit, 2-8% slower from
# 8 tokens on, faster only at Kimi-K2 one token, results/gpu-issue28/run-9);
# MOE_CONFORMANCE_GLUON_BLOCK_N=128 for A/B runs of the suites, sanitizers and make bench
GLUON_BLOCK_N = int(os.environ.get("MOE_CONFORMANCE_GLUON_BLOCK_N", "64"))
# GEMM2's (ungated: one tile a step, its MMA exposed): 128, two consumer warpgroups a program, in run-9's tune-w2
# 1-2% faster at 5 of 6 points (Kimi-K2 64 tokens 2112 -> 2065 us, 77% of copy), 2% slower at gpt-oss-120b 8 tokens
GLUON_W2_BLOCK_N = int(os.environ.get("MOE_CONFORMANCE_GLUON_W2_BLOCK_N", "128"))
# NVFP4 W4A16 through the Gluon kernel: on the H200 (run-9) conformance and special values passed, memcheck and
# synccheck clean, bit for bit with triton_bitplace wherever the epilogues round alike; 8-13% faster than it from 8
# tokens on. MOE_CONFORMANCE_GLUON_NVFP4=0: NVFP4 through moe_gemm_kernel (A/B runs)
GLUON_NVFP4 = os.environ.get("MOE_CONFORMANCE_GLUON_NVFP4", "1") == "1"
# quantized activations through the Gluon kernel (W4A4: MXFP4 / NVFP4 activations; W4A8: static FP8): their values are
# exact bf16 with at most one fp32 scale, which the epilogue kernels apply (and GEMM1's epilogue quantizes GEMM2's
# NVFP4 input), so the kernel is the W4A16 one. On the H200 (results/gpu-issue28/run-11): 36 of 36 NVFP4 / MXFP4 W4A4
# points bit for bit with triton_bitplace (split 1 / 3, pdl 0 / 1, graph replays), conformance and special values
# passed, memcheck and synccheck clean; NVFP4 W4A4 7-13% faster than triton_bitplace's from 8 tokens on.
# MOE_CONFORMANCE_GLUON_QUANTIZED_ACT=0: quantized activations through moe_gemm_kernel (A/B runs)
GLUON_QUANTIZED_ACT = os.environ.get("MOE_CONFORMANCE_GLUON_QUANTIZED_ACT", "1") == "1"
# the decode chain as programmatic dependent launches (triton_kernels.PDL_ORDER: each kernel may start under the
# one before) at every decode point: with GEMM2 prefetching its weights into L2 while GEMM1 ends (pdl 1) where they
# fit in half the H200's 50 MB L2 beside GEMM1's stream (GLUON_PDL_BYTES), else without the prefetch (pdl 2).
# run-9's tune-pdl: pdl 1 at gpt-oss-120b one token (GEMM2 17.6 MB) 39.1 -> 36.8 us, 2-5% slower wherever GEMM2's
# weights are larger (Kimi-K2 one token 62 MB; 8 and 64 tokens, 112 MB and more). run-12 (results/gpu-issue28/run-12,
# graph replays bit for bit): pdl 2 against none, Kimi-K2 MXFP4 one token 91.3 -> 85.6 us (pdl 1 88.9), 8 tokens
# 451.3 -> 436.4 (pdl 1 462.4), 64 tokens 2123.8 -> 2060.5, gpt-oss-120b 8 tokens 136.0 -> 135.1, 64 tokens 503.0 ->
# 504.6 (noise), NVFP4 W4A4 Kimi-K2 8 tokens 514.1 -> 503.2; gpt-oss-120b one token pdl 1 36.4, pdl 2 36.8.
# The prefetch's L2 footprint as the cause of pdl 1's losses is the reading, not a measurement.
# MOE_CONFORMANCE_GLUON_PDL=0 / 1 / 2 sets one everywhere (A/B runs), as the tiles' `pdl` key does (tools/tune_moe.py)
GLUON_PDL = os.environ.get("MOE_CONFORMANCE_GLUON_PDL")
GLUON_PDL_BYTES = 25 << 20
# the rows a program where a GEMM's 64-row grid (split to fill, split_k_to_fill) is one wave or less, as at one token:
# there the programs a multiprocessor are few and each streams its K alone, so what hides the latency is the consumer
# warpgroups resident. 128 rows (two consumer warpgroups a program, 2 programs a multiprocessor against 3) where that
# puts at least GLUON_WIDE_GAIN times the consumer warpgroups of 64-row tiles on the multiprocessors in one wave, else
# 64; beyond one wave the defaults above (one_wave_block_n). run-12's one-token sweep (results/gpu-issue28/run-12,
# 32 configs a model): Kimi-K2 GEMM1 128 rows split 2 (512 warpgroups against 256) 88.4 us against 89.6-96.5 at 64;
# gpt-oss-120b 64 rows for both GEMMs (368 against 360 warpgroups: no gain) 36.6 against 38.7 with GEMM2 at 128
GLUON_WIDE_GAIN = 1.5
# GEMM1 at most 16 tokens under pdl: each program's first GLUON_W13_PREFETCH K chunks of gate and up weights
# prefetched into L2 before its wait for the routing launch (the tiles' w13_prefetch, gluon_kernels' PDL 3), so that
# the weight stream starts while moe_align_kernel runs (GEMM1 waits for it ~2 us at one token), where GEMM1's
# weights of the call are at most GLUON_W13_PREFETCH_BYTES. On an H100 (results/gpu-issue28/run-33, replay wall
# time, time line): gpt-oss-120b one token (GEMM1 35 MB) MXFP4 39.8 -> 38.8 us, NVFP4 W4A4 43.4 -> 42.4 with 4 chunks
# (a program's 11 at split 2), 41.4 / 46.1 with all of them; Kimi-K2 one token (125 MB) 101.4 -> 103.5 (4) and
# 112.4 (all), gpt-oss-120b 8 tokens (220 MB) 158.7 -> 159.6 (4) and 182.7 (all): a prefetch past what L2 keeps
# beside GEMM2's (pdl 1) evicts lines before they are read.
# MOE_CONFORMANCE_GLUON_W13_PREFETCH=N sets N chunks at every decode point (0: off) for A/B runs
GLUON_W13_PREFETCH = 4
# The Gluon kernel reads a second copy of the weights laid out tile-major (gluon_kernels.tile_major_codes /
# tile_major_scales: each 64-row tile's K steps one contiguous run, a 4 KB TMA box a step, instead of 128 bytes from
# each of 32 row pairs 2880 bytes apart at gpt-oss-120b's GEMM1), where a GEMM's rows are whole 64-row tiles. Why:
# run-33's ncu found GEMM1's consumers waiting on their loads about half their time at one and 8 tokens, DRAM at
# 56% / 75% of its peak, and deeper rings had been slower (run-8): the DRAM's efficiency on scattered 128-byte runs.
# On an H100 (results/gpu-issue28/run-33 PART=tile, replay wall time, two runs each): bit for bit with
# triton_bitplace at 36 of 36 points, and faster at every point: gpt-oss-120b MXFP4 1 / 8 / 64 tokens 38.7 -> 38.1,
# 153.6 -> 150.3, 570.3 -> 551.5 us; Kimi-K2 98.6 -> 96.5, 500.6 -> 488.8, 2385.2 -> 2330.5; NVFP4 W4A4 gpt-oss-120b 8
# tokens 165.8 -> 162.0. The cost: the backend holds both layouts (its prefill path, moe_gemm_kernel, reads pair
# rows). MOE_CONFORMANCE_GLUON_TILE_MAJOR=0: pair rows only (A/B runs)
GLUON_TILE_MAJOR = os.environ.get("MOE_CONFORMANCE_GLUON_TILE_MAJOR", "1") == "1"
GLUON_W13_PREFETCH_BYTES = 40 << 20
# Prefill (blocks of more than 16 pairs) through the Gluon kernel too (the tiles' gluon_prefill): each expert block of
# block_m pairs is the wgmma's N (64: Kimi-K2's ~171 rows an expert pad to 192, gpt-oss-120b's 256 to 256, no tail
# blocks), two consumer warpgroups a program on 128 weight rows over the whole K, a 4-warp producer (TMA weights,
# cp.async activation rows), the epilogue from the accumulators (no partial sums: GEMM1's of Kimi-K2 at 8192 tokens
# would be 1 GB each way), the programs in groups of 8 expert blocks (group_m, as moe_gemm_kernel's prefill rows). Why:
# moe_gemm_kernel's FP4 prefill rows run loads, decode and MMAs in the same warps, 248 registers, at 42-51% of dense
# bf16 on an H100 (results/gpu-issue28/run-34); here the loads leave the consumers, and a K step's decode (~170
# instructions a warp and 64-row tile) is under half its MMA time at 64 pairs. Compiled for sm90 by Triton 3.6 at
# maxnreg 168 without spills (consumers at 224 / 224 registers, the producer 56, 164 KB of shared memory at 4
# stages: one program a multiprocessor). On an H100 (results/gpu-issue28/run-37): bit for bit with moe_gemm_kernel's
# 64-pair blocks, and 13-16% slower than the rows below at 8192 tokens (gpt-oss-120b MXFP4 3963.0 -> 4519.7 us,
# NVFP4 4280.5 -> 4851.0, W4A4 4809.3 -> 5597.4); other tiles (run-38, MXFP4): 128-pair blocks at 3 stages 4212.5 us
# (its GEMM2 1387 us against the rows' 1258 + 176, its GEMM1 2675 against 2064 + 317; NVFP4 W4A4 6739.6), 64 x 64 on
# one consumer 4361.8, 64-pair blocks at 3 stages 4502.7, without group_m 4811.0: none faster. Opt-in:
# MOE_CONFORMANCE_GLUON_PREFILL=1 makes it triton_bitplace_gluon's prefill row
GLUON_PREFILL = os.environ.get("MOE_CONFORMANCE_GLUON_PREFILL", "0") == "1"
GLUON_PREFILL_TILES = dict(block_m=64, block_n=128, block_k=128, num_warps=4, num_stages=4, maxnreg=168, group_m=8,
                           gluon_prefill=1)
GLUON_W13_PREFETCH_SET = os.environ.get("MOE_CONFORMANCE_GLUON_W13_PREFETCH")


def gluon_programs_per_sm(block_n: int, maxnreg: int = GLUON_MAXNREG) -> int:
    """Programs a multiprocessor of the Gluon kernel by registers: 64-row consumer warpgroups and the producer warp
    padded to a warpgroup, at the launch's register cap (80: 3 programs at 64 rows, 2 at 128)."""
    return 65536 // (maxnreg * 128 * (1 + block_n // 64))


def gluon_programs_at_once(block_n: int, maxnreg: int, stages: int, gated: bool, nvfp4: bool, sms: int) -> int:
    """Programs of the Gluon kernel resident at once (a persistent grid's size): by registers
    (gluon_programs_per_sm) and by the ring's shared memory (each slot: every 64-row tile's codes, 4 KB, and scale
    box, 256 or 512 bytes, gate and up when gated, and the block's activation rows, 4 KB; 227 KB a multiprocessor)."""
    tiles = block_n // 64 * (2 if gated else 1)
    ring = stages * (tiles * (4096 + (512 if nvfp4 else 256)) + 16 * 128 * 2)
    return sms * max(1, min(gluon_programs_per_sm(block_n, maxnreg), (227 << 10) // ring))


def one_wave_block_n(experts: int, n_out: int, sms: int, split_of) -> int | None:
    """GEMM's rows a program by the one-wave rule (GLUON_WIDE_GAIN) for `experts` expert blocks of n_out rows,
    split_of(programs unsplit) its K splits; None where the 64-row grid is more than one wave."""
    warpgroups = {}
    for rows in (64, 128):
        tiles = experts * -(-n_out // rows)
        programs = tiles * split_of(tiles)
        fits = programs <= gluon_programs_per_sm(rows) * sms
        warpgroups[rows] = programs * rows // 64 if fits else None
    if warpgroups[64] is None:
        return None
    return 128 if warpgroups[128] and warpgroups[128] >= GLUON_WIDE_GAIN * warpgroups[64] else 64


class TritonBitplaceGluonBackend(TritonBitplaceBackend):
    """triton_bitplace with its MXFP4 and NVFP4 x bf16 GEMMs at decode (16-pair blocks) by the warp-specialised
    Gluon kernel (harness/backends/gluon_kernels.py); prefill-size blocks and the K step's contract misses go to
    moe_gemm_kernel. A backend of its own so that one run checks and times both (issue 28)."""

    name = "triton_bitplace_gluon"
    gluon = True
    row_pairs = True  # the kernel's TMA boxes are of the row-paired layout

    def tile_config(self, n_pairs: int, weight_kind, act_kind=None) -> dict:
        tiles = super().tile_config(n_pairs, weight_kind, act_kind)
        if self.tiles is None and tiles["block_m"] == 16:  # the decode row: a 4-deep ring (51 KB, 3 programs an SM)
            tiles["num_stages"] = GLUON_STAGES
            tiles["block_n"] = GLUON_BLOCK_N
            tiles["w2_block_n"] = GLUON_W2_BLOCK_N
            if "split_k_programs" in tiles:
                tiles["split_k_programs"] = GLUON_SPLIT_K_PROGRAMS
            if GLUON_PDL is None:
                tiles["pdl_bytes"] = GLUON_PDL_BYTES
            tiles["one_wave_rows"] = 1
            if GLUON_W13_PREFETCH_SET is None:
                tiles["w13_prefetch_bytes"] = GLUON_W13_PREFETCH_BYTES
            elif int(GLUON_W13_PREFETCH_SET):
                tiles["w13_prefetch"] = int(GLUON_W13_PREFETCH_SET)
            if GLUON_TILE_MAJOR:
                tiles["tile_major"] = 1
        if self.tiles is None and tiles["block_m"] != 16 and GLUON_PREFILL:
            tiles = dict(GLUON_PREFILL_TILES, **({"tile_major": 1} if GLUON_TILE_MAJOR else {}))
        if tiles["block_m"] == 16 and "pdl_bytes" not in tiles:
            tiles.setdefault("pdl", int(GLUON_PDL or 0))
        return tiles

    def resolve_tiles(self, tiles: dict, prepared, p: int, dev) -> dict:
        if "w13_prefetch_bytes" in tiles:  # GEMM1's prefetch before its wait where its weights of the call fit
            w13_bytes = min(prepared.ckpt.num_experts, p) * sum(
                t[0].numel() * t.element_size() for t in (prepared.w13, prepared.w13_scale) if t is not None)
            fits = w13_bytes <= tiles["w13_prefetch_bytes"]
            tiles = {**{k: v for k, v in tiles.items() if k != "w13_prefetch_bytes"},
                     **({"w13_prefetch": GLUON_W13_PREFETCH} if fits else {})}
        if tiles.get("one_wave_rows"):  # both GEMMs' rows a program by the one-wave rule, then the splits
            tiles = {k: v for k, v in tiles.items() if k != "one_wave_rows"}
            ckpt = prepared.ckpt
            experts = min(ckpt.num_experts, p)
            sms = multiprocessors(dev)
            if "split_k_programs" in tiles and not tiles.get("split_k"):
                def fill(programs: int) -> int:  # the splits split_k_to_fill gives a grid of that many
                    return split_k_to_fill(dict(split_k_programs=tiles["split_k_programs"]), programs)["split_k"]

                tiles["block_n"] = one_wave_block_n(experts, ckpt.intermediate_size, sms, fill) or tiles["block_n"]
                split = fill(experts * -(-ckpt.intermediate_size // tiles["block_n"]))
                w2 = one_wave_block_n(experts, ckpt.hidden_size, sms, lambda _: split)
                tiles["w2_block_n"] = w2 or tiles.get("w2_block_n") or tiles["block_n"]
        return super().resolve_tiles(tiles, prepared, p, dev)

    def supports(self, problem, platform) -> tuple[bool, str]:
        w, act = problem.scheme.weight, problem.scheme.act
        if w is None or not (w.kind is NVFP4 or w.kind is MX and w.elem is E2M1):
            return False, "the Gluon decode GEMM: MXFP4 or NVFP4 weights only"
        if act is not None and not GLUON_QUANTIZED_ACT:
            return False, ("quantized activations through the Gluon decode GEMM are off "
                           "(MOE_CONFORMANCE_GLUON_QUANTIZED_ACT=0 in the environment)")
        if w.kind is NVFP4 and not GLUON_NVFP4:
            return False, ("NVFP4 through the Gluon decode GEMM is off (MOE_CONFORMANCE_GLUON_NVFP4=0 in the "
                           "environment)")
        return super().supports(problem, platform)

    def available(self, platform) -> tuple[bool, str]:
        from harness.platforms import detect_platform

        if triton_kernels.INTERPRET or not torch.cuda.is_available():
            return False, "Gluon kernels compile for a CUDA GPU only (Triton has no Gluon interpreter)"
        if torch.cuda.get_device_capability()[0] != 9:
            return False, "the Gluon decode GEMM issues Hopper's wgmma and TMA: sm90 only"
        if platform is not detect_platform():
            return False, f"compiled for this machine's {detect_platform().name}, not {platform.name}"
        return True, ""


def make_backend() -> TritonBitplaceBackend:
    return TritonBitplaceBackend()


def make_gluon_backend() -> TritonBitplaceGluonBackend:
    return TritonBitplaceGluonBackend()
