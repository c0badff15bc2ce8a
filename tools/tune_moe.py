"""Sweep tile sizes and launch parameters of the Triton MoE kernels on the GPU, at the gpt-oss-120b
shape (and Qwen3 for NVFP4): median CUDA-graph replay time per config, after an L2 flush.

    python3 tools/tune_moe.py [--quick | --prefill] [--case MODEL/SCHEME/BACKEND ...] [--tokens 8 64]
                              [--where KEY=V1,V2 ...] [--set KEY=INT ...] [--warm-s 1]
    (--quick: decode, 8 and 64 tokens; --prefill: 8192 tokens; --where keeps the grid's configs whose KEY is one
    of the values, e.g. --where mma_steps=1 --where block_n=64,128; JSON to $OUT/tune.json, or results/;
    --warm-s: the prefill grid's configs (512 tokens and more) each run that many seconds back to back before they
    are timed, against the dense matmul's rate read the same way: both where the H200's power cap holds them, make
    bench's sustained regime (harness.bench.SUSTAIN_S; make bench also reads them cold and judges the lower); 0:
    each config timed from the state its compilation left, near cold)

The best config per (backend, scheme, token count) goes into the backends' tile table
(harness/backends/triton_emulation.py: TILE_TABLE) by hand, with the run recorded in BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from harness.backends import load_backend  # noqa: E402
from harness.bench.report import finish_tool  # noqa: E402
from harness.bench import (MODEL_SHAPES, SUSTAIN_S, capture, copy_bandwidth, dense_bf16_tflops, device_checkpoint, median_ms,  # noqa: E402
                           moe_flops, routed_inputs, weight_bytes)

DECODE = [dict(block_m=16, block_n=n, block_k=k, num_warps=w, num_stages=s)
          for n, k, w, s in itertools.product((32, 64, 128), (128, 256), (4,), (2, 3, 4))]
# group_m: the tiles in groups of that many row blocks (triton_kernels.grouped_tile_order; 0 the plain order); tma 1:
# the block-gathered activation rows (and bf16 weights) by TMA (moe_gemm_kernel's A_TMA / W_TMA), 2 the bf16 weights
# alone (no gathered copy); tail_m: each
# expert's rows padded to that many, not block_m, its last rows in a second launch of tail_m-row blocks (0: one launch);
# persistent: that many programs a multiprocessor, each computing tiles in turn (moe_gemm_kernel's PERSISTENT; 0 the
# plain grid); w2_block_n: GEMM2's N tile where it differs (0: block_n); warp_spec: the bf16 TMA loop warp-specialized
# by Triton (a producer warpgroup and consumer warpgroups; tma 1, 128-row tiles, no tails; at 4 warps 2 stages at most:
# more gave wrong outputs on the H200, results/gpu-issue28/run-24);
# inline_tails: the tail blocks in the GEMM's one launch at tail_m rows (tail_m = block_m / 2; not tma 1)
PREFILL = [dict(block_m=m, block_n=n, block_k=k, num_warps=w, num_stages=s, group_m=g, tma=t, tail_m=tm, persistent=p,
                w2_block_n=n2, warp_spec=ws, inline_tails=it)
           for m, n, k, w, s, g, t, tm, p, n2, ws, it in itertools.product(
               (64, 128), (64, 128), (64,), (4, 8), (2, 3, 4), (0, 4, 8, 16), (0, 1, 2), (0, 32, 64), (0, 1, 2),
               (0, 256), (0, 1), (0, 1))
           if tm < m and not (ws and (t != 1 or m < 128 or tm or p or (w == 4 and s > 2)))
           and not (it and (2 * tm != m or t == 1 or p))]
# triton_bitplace: one 128-value chunk per K step and one warpgroup (its tiles' layout is the wgmma operand's);
# mma_steps 2 with maxnreg 96 compiles to 96 registers (5 programs per SM instead of 4, no spill in the loop);
# split_k shares a tile's K chunks among programs (few tokens leave SMs idle: 180 programs at gpt-oss, 1 token);
# block_n 128 is 64 row pairs in the row-paired layout (the default; MOE_CONFORMANCE_BITPLACE_ROW_PAIRS=0 stores
# rows one by one); 8 warps: two warpgroups on one activation tile, 128 or 256 rows (triton_kernels' Hopper tiles)
# serial_k 1: a split tile finished in the GEMM's launch by its last split (no splitk_epilogue_kernel launch)
BITPLACE_DECODE = [dict(block_m=16, block_n=n, block_k=128, num_warps=w, num_stages=s, mma_steps=k, maxnreg=r,
                        split_k=sk, serial_k=sr)
                   for (n, w), s, k, r, sk, sr in itertools.product(((64, 4), (128, 4), (128, 8), (256, 8)), (3, 4),
                                                                    (1, 2), (0, 96), (1, 2, 4), (0, 1))
                   if sk > 1 or not sr]
# triton_bitplace_gluon (the warp-specialised Gluon decode GEMM, 64-row tiles): its ring's depth (num_stages), the
# launch's register cap (maxnreg: 80 gives 3 programs a multiprocessor; 64 four, the gated consumer's K loop then at
# 88 registers, where ptxas re-serialises the wgmma: 369 SASS a step against 343, no spill in the CPU compile) and
# split_k
# (the 64-register cap never won in run-7's sweep, two consumer warpgroups a program (block_n 128) in run-9's;
# GEMM2's schedule apart from GEMM1's: one tile a step, 1 pairs two steps an iteration, 2 lags its MMAs; GEMM1's
# schedule 2 never won)
# GEMM2 with two consumer warpgroups a program (w2_block_n 128) apart from GEMM1 likewise; pdl 1 the chain as
# programmatic dependents (triton_kernels.PDL_ORDER), 2 the same without GEMM2's L2 prefetch; --where picks a part)
# persistent 1: each GEMM as a persistent grid (schedule 0 only); 2592 configs a point: restrict with --where; block_n 128 and split 3 / 4 for one token, where GEMM1 is one partial
# wave: run-11's Kimi-K2 one token at block_n 128 93.2 us against 96.5)
# serial_k 1: GEMM1's epilogue in its own launch (the tile's last split; not with persistent)
GLUON_DECODE = [dict(block_m=16, block_n=n, block_k=128, num_warps=4, num_stages=s, maxnreg=80, split_k=sk,
                     mma_overlap=o, w2_mma_overlap=o2, w2_block_n=n2, pdl=pdl, persistent=ps, serial_k=sr)
                for n, s, sk, o, o2, n2, pdl, ps, sr in itertools.product((64, 128), (3, 4, 6), (1, 2, 3, 4), (0, 1),
                                                                          (0, 1, 2), (64, 128), (0, 1, 2), (0, 1),
                                                                          (0, 1))
                if not (ps and sr)]
# prefill: 64 weight rows a program on one warpgroup, or 128 on two (8 warps: the activation tile shared by both, no
# decode done twice); mma_steps 2 halves the decoded tile held in registers (255 a thread at 128 rows either way)
BITPLACE_PREFILL = [dict(block_m=m, block_n=n, block_k=128, num_warps=w, num_stages=s, group_m=g, tma=t, tail_m=tm,
                         persistent=p, mma_steps=k, inline_tails=it)
                    for m, (n, w), s, g, t, tm, p, k, it in itertools.product(
                        (64, 128), ((64, 4), (128, 8)), (2, 3, 4), (0, 4, 8, 16), (0, 1), (0, 32, 64), (0, 1, 2, 3),
                        (1, 2), (0, 1))
                    # tma at 128 rows: refused (it races when compiled, run-23)
                    if tm < m and not (t and m > 64) and not (it and (2 * tm != m or t or p))]
# triton_bitplace_gluon's prefill (gluon_prefill: each expert block of block_m pairs the wgmma's N, 64 weight rows a
# consumer warpgroup, one or two a program, the whole K a program, the epilogue from the accumulators): the ring's
# depth, the grid's order and the register cap (168: two consumers at 224 and the producer, or one consumer at 256,
# one program a multiprocessor; 128 at 64 x 64: one consumer at 200, two programs where the ring fits twice; at 128
# pairs and 128 registers GEMM1's consumer spills); 128 x 128 at 4 stages needs 228-232 KB of shared memory, over the
# 227 KB a block may have (results/cpu-issue28/gluon-prefill-grid-sm90-triton3.6.txt: also W4A4's spills at 128 x 128)
GLUON_PREFILL = [dict(block_m=m, block_n=n, block_k=128, num_warps=4, num_stages=s,
                      maxnreg=128 if (m, n) == (64, 64) else 168,
                      group_m=g, gluon_prefill=1, tile_major=1)
                 for m, n, s, g in itertools.product((64, 128), (64, 128), (2, 3, 4), (0, 8))
                 if not (m == n == 128 and s == 4)]
# triton_emulation's bf16 prefill through the Gluon kernel (gluon_bf16: a producer warpgroup, two consumer warpgroups
# with both wgmma operands in shared memory, 128 outputs a program gated, 256 ungated): expert blocks of 64 or 128
# pairs (the wgmma's N), the ring's depth (4 stages: 192 / 224 KB of shared memory; 5 at 64 pairs is over 227 KB),
# persistent (one program a multiprocessor), each expert's short block inline at 64 pairs (128-pair blocks), the
# grid's order; swept with PREFILL for bf16 (--where gluon_bf16=1: these alone)
GLUON_BF16_PREFILL = [dict(block_m=m, block_n=128, w2_block_n=256, block_k=64, num_warps=4, num_stages=s, maxnreg=168,
                           group_m=g, persistent=p, tail_m=64 if it else 0, inline_tails=it, gluon_bf16=1)
                      for m, s, g, p, it in itertools.product((64, 128), (2, 3, 4), (0, 8), (0, 1), (0, 1))
                      if not (it and m != 128)]
CASES = [("gpt-oss-120b", "w_mxfp4", "triton_dot_scaled"), ("gpt-oss-120b", "w_mxfp4", "triton_emulation"),
         ("gpt-oss-120b", "w_nvfp4", "triton_emulation"), ("gpt-oss-120b", "bf16", "triton_emulation")]


def _pct_dense(row: dict, shape, tokens: int, warm_s: float) -> float:
    """The row's MoE FLOPs per second as a percentage of this GPU's dense bf16 matmul rate (stored in the row),
    cold or sustained as the row was timed."""
    row["pct_dense"] = 100 * moe_flops(shape, tokens) / (row["us"] / 1e6) / (dense_bf16_tflops(warm_s) * 1e12)
    return row["pct_dense"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--prefill", action="store_true")
    parser.add_argument("--case", action="append", help="MODEL/SCHEME/BACKEND (default: the built-in cases)")
    parser.add_argument("--tokens", type=int, nargs="+")
    parser.add_argument("--where", action="append", default=[], metavar="KEY=V1,V2",
                        help="keep only the grid's configs whose KEY is one of these (ints)")
    parser.add_argument("--warm-s", type=float, default=SUSTAIN_S,
                        help="seconds back to back before timing a config at 512 tokens or more (0: cold)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=INT",
                        help="a launch parameter added to every config swept (one the grid does not sweep: "
                             "quant_launch=1)")
    args = parser.parse_args()
    extra = {k: int(v) for k, v in (s.split("=", 1) for s in args.set)}
    keep = {k: {int(v) for v in vs.split(",")} for k, vs in (w.split("=", 1) for w in args.where)}
    quick, prefill = args.quick, args.prefill
    cases = [tuple(c.split("/")) for c in args.case] if args.case else CASES
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s")
    results = []
    for model, scheme, name in cases:
        shape = MODEL_SHAPES[model]
        ckpt = device_checkpoint(shape, scheme, "cuda")
        backend = load_backend(name)
        prep = backend.prepare(ckpt)
        if prefill and scheme == "w_nvfp4":
            continue
        for tokens in args.tokens or ((8192,) if prefill else (8, 64) if quick else (1, 8, 64, 512, 8192)):
            x, w, ids = routed_inputs(shape, tokens, "cuda")
            w = w.float().contiguous()
            nbytes = weight_bytes(ckpt, ids)
            best = None
            bitplace = name.startswith("triton_bitplace")
            decode = GLUON_DECODE if name == "triton_bitplace_gluon" else BITPLACE_DECODE if bitplace else DECODE
            prefill_grid = (GLUON_PREFILL if name == "triton_bitplace_gluon" else BITPLACE_PREFILL if bitplace
                            else PREFILL + GLUON_BF16_PREFILL if scheme == "bf16" else PREFILL)
            grid = prefill_grid if tokens >= 512 else decode
            for cfg in ({**c, **extra} for c in grid if all(c.get(k) in vs for k, vs in keep.items())):
                backend.configure(**cfg)
                try:
                    replay, _ = capture(lambda: backend.launch(prep, x, w, ids))
                    ms = median_ms(replay, rounds=10, warm_s=args.warm_s if tokens >= 512 else 0.0)
                except Exception as exc:  # a config the compiler refuses (shared memory): skip it
                    print(f"  {cfg}: {type(exc).__name__}: {str(exc)[:100]}")
                    continue
                row = dict(model=model, scheme=scheme, backend=name, tokens=tokens, **cfg, us=ms * 1e3,
                           pct_copy=100 * nbytes / (ms / 1e3) / bw)
                # prefill's target metric: the MoE's FLOPs against a dense bf16 matmul on this GPU (BENCHMARKS.md)
                dense = f", {_pct_dense(row, shape, tokens, args.warm_s):.1f}% of dense bf16" if tokens >= 512 else ""
                results.append(row)
                print(f"  T={tokens} {cfg}: {row['us']:.1f} us, {row['pct_copy']:.1f}% of copy{dense}", flush=True)
                if best is None or ms * 1e3 < best["us"]:
                    best = row
            dense = f", {best['pct_dense']:.1f}% of dense bf16" if "pct_dense" in best else ""
            print(f"{model} {scheme} {name} T={tokens}: best {best['us']:.1f} us ({best['pct_copy']:.1f}% of copy"
                  f"{dense}) with {({k: best[k] for k in cfg})}", flush=True)
        del prep, ckpt
        torch.cuda.empty_cache()
    return finish_tool("tune.json", bw, results)


if __name__ == "__main__":
    sys.exit(main())
