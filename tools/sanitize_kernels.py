"""Run every Triton kernel of triton_emulation once per weight kind and activation family, small
shapes, for compute-sanitizer (GPU only); the routing runs in moe_align_kernel (under 1024 pairs) and in
align_layouts' three kernels (above), and
triton_bitplace's split-K partial sums and their epilogue kernel run once:

    compute-sanitizer --tool memcheck  python3 tools/sanitize_kernels.py
    compute-sanitizer --tool racecheck python3 tools/sanitize_kernels.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from harness.backends.triton_emulation import TritonEmulationBackend  # noqa: E402
from harness.core.conformance import Shape, case_inputs  # noqa: E402
from reference.checkpoints import make_checkpoint  # noqa: E402
from reference.formats import E2M1, E4M3FN  # noqa: E402
from reference.fp8 import Granularity  # noqa: E402
from reference.mx import ScaleMode  # noqa: E402

SHAPE = Shape(num_experts=4, hidden_size=256, intermediate_size=128, tokens=7, top_k=2)  # odd token count: padding
CASES = [("bf16", "SILU"), ("w_mxfp4", "SWIGLUOAI"), ("w_mxfp4_a_mxfp4", "SITU"), ("w_mxfp6_e2m3", "GELU_NO_MUL"),
         ("w_nvfp4_a_nvfp4", "GELU_TANH"), ("w_fp8_a_fp8", "RELU2"), ("w_fp8_a_fp8_block", "SWIGLUSTEP"),
         ("w_mxfp6_e3m2_a_fp8", "SILU")]


_PREFILL_BF16_TMA = dict(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=4, group_m=8, tma=1)
_PREFILL_FP4_TMA = dict(block_m=64, block_n=64, block_k=128, num_warps=4, num_stages=3, group_m=8, tma=1)


def _bitplace(**switches):
    """triton_bitplace with issue 28's switches set (row_pairs, gluon)."""
    from harness.backends.triton_bitplace import TritonBitplaceBackend

    backend = TritonBitplaceBackend()
    for name, value in switches.items():
        setattr(backend, name, value)
    return backend


def main() -> int:
    from harness.backends import triton_bitplace

    triton_bitplace.GLUON_NVFP4 = True  # the NVFP4 path of the Gluon kernel too, whatever the environment says
    triton_bitplace.GLUON_QUANTIZED_ACT = True  # and its quantized activations (whatever the environment says)
    b = TritonEmulationBackend()
    for scheme, act in CASES:
        ckpt = make_checkpoint(scheme, act, SHAPE.num_experts, SHAPE.hidden_size, SHAPE.intermediate_size, seed=1,
                               with_bias=act == "SWIGLUOAI")
        x, w, ids = case_inputs(SHAPE, 1)
        out = b.forward(b.prepare(ckpt), x.cuda(), w.cuda(), ids.cuda())
        torch.cuda.synchronize()
        print(scheme, act, tuple(out.shape), bool(torch.isfinite(out).all()))
    # K not a multiple of the tile (as gpt-oss's 2880): the masked tails of both GEMM paths
    from harness.backends.triton_bitplace import TritonBitplaceBackend
    from harness.backends.triton_dot_scaled import TritonDotScaledBackend

    tail = Shape(num_experts=4, hidden_size=160, intermediate_size=96, tokens=7, top_k=2)
    for backend, scheme, act in ((TritonDotScaledBackend(), "w_mxfp4", "SWIGLUOAI"), (b, "w_nvfp4", "SILU"),
                                 (b, "w_mxfp4", "SILU"), (TritonBitplaceBackend(), "w_mxfp4", "SWIGLUOAI"),
                                 (TritonBitplaceBackend(), "w_nvfp4", "SILU"),
                                 # split-K: three programs share 2 (GEMM1) and 1 (GEMM2) chunks, some get none
                                 (TritonBitplaceBackend().configure(block_m=16, block_n=64, block_k=128, num_warps=4,
                                                                    num_stages=3, split_k=3),
                                  "w_nvfp4_a_nvfp4", "SWIGLUOAI"),
                                 # the same tiles finished in the GEMM's launch by their last split (serial_k: an
                                 # atomic count a tile, the partial sums read back past L1)
                                 (TritonBitplaceBackend().configure(block_m=16, block_n=64, block_k=128, num_warps=4,
                                                                    num_stages=3, split_k=3, serial_k=1),
                                  "w_nvfp4_a_nvfp4", "SWIGLUOAI"),
                                 # NVFP4 W4A16's prefill row (128 rows, 8 warps; every expert's rows in 32-row tails)
                                 (_bitplace().configure(block_m=128, block_n=128, block_k=128, num_warps=8,
                                                        num_stages=3, group_m=8, tail_m=32), "w_nvfp4", "SWIGLUOAI"),
                                 # W4A4's, the same row since run-30 (the epilogue's NVFP4 quantization of GEMM2's
                                 # input on 8 warps, on full and 32-row tail blocks)
                                 (_bitplace().configure(block_m=128, block_n=128, block_k=128, num_warps=8,
                                                        num_stages=3, group_m=8, tail_m=32), "w_nvfp4_a_nvfp4",
                                  "SWIGLUOAI"),
                                 # the layout with rows one by one (issue 28's A/B switch; row pairs are the default)
                                 (_bitplace(row_pairs=False), "w_mxfp4", "SWIGLUOAI"),
                                 (_bitplace(row_pairs=False), "w_nvfp4", "SILU"),
                                 # two warpgroups on one activation tile (128 rows, 8 warps)
                                 (_bitplace().configure(block_m=16, block_n=128, block_k=128, num_warps=8,
                                                        num_stages=3), "w_nvfp4_a_nvfp4", "SWIGLUOAI"),
                                 # the warp-specialised Gluon decode GEMM (TMA, mbarriers), unsplit and split 3 ways
                                 (_bitplace(gluon=True), "w_mxfp4", "SWIGLUOAI"),
                                 (_bitplace(gluon=True).configure(block_m=16, block_n=64, block_k=128, num_warps=4,
                                                                  num_stages=3, split_k=3), "w_mxfp4", "SILU"),
                                 # its tiles finished in its own launch by their last split (serial_k), split 3
                                 # ways (GEMM2's second and third splits empty), and on two warpgroups with GEMM2
                                 # unfolded (its last program's second tile past N_OUT: no count, no outputs)
                                 (_bitplace(gluon=True).configure(block_m=16, block_n=64, block_k=128, num_warps=4,
                                                                  num_stages=3, split_k=3, serial_k=1), "w_mxfp4",
                                  "SWIGLUOAI"),
                                 (_bitplace(gluon=True, fold_epilogues=False).configure(
                                     block_m=16, block_n=128, block_k=128, num_warps=4, num_stages=3, split_k=2,
                                     serial_k=1), "w_mxfp4", "SILU"),
                                 (_bitplace(gluon=True).configure(block_m=16, block_n=128, block_k=128, num_warps=4,
                                                                  num_stages=3, serial_k=1), "w_nvfp4_a_nvfp4",
                                  "SILU"),
                                 # its two other consumer schedules; the lagging one on the shortest ring
                                 (_bitplace(gluon=True).configure(block_m=16, block_n=64, block_k=128, num_warps=4,
                                                                  num_stages=3, mma_overlap=1), "w_mxfp4",
                                  "SWIGLUOAI"),
                                 (_bitplace(gluon=True).configure(block_m=16, block_n=64, block_k=128, num_warps=4,
                                                                  num_stages=2, mma_overlap=2), "w_mxfp4",
                                  "SWIGLUOAI"),
                                 # two consumer warpgroups a program: GEMM1's second tile half past N (96 rows),
                                 # GEMM2's last program's second tile wholly past it (160 rows), TMA fills zeros
                                 (_bitplace(gluon=True).configure(block_m=16, block_n=128, block_k=128, num_warps=4,
                                                                  num_stages=4), "w_mxfp4", "SWIGLUOAI"),
                                 (_bitplace(gluon=True).configure(block_m=16, block_n=128, block_k=128, num_warps=4,
                                                                  num_stages=3, split_k=3, mma_overlap=2), "w_mxfp4",
                                  "SILU"),
                                 # NVFP4 W4A16 through it: 512-byte scale boxes, unsplit and split 3 ways
                                 (_bitplace(gluon=True), "w_nvfp4", "SWIGLUOAI"),
                                 (_bitplace(gluon=True).configure(block_m=16, block_n=64, block_k=128, num_warps=4,
                                                                  num_stages=3, split_k=3), "w_nvfp4", "SILU"),
                                 # the chain as programmatic dependents (triton_kernels.PDL_ORDER)
                                 (_bitplace(gluon=True).configure(block_m=16, block_n=64, block_k=128, num_warps=4,
                                                                  num_stages=4, pdl=1), "w_mxfp4", "SWIGLUOAI"),
                                 # quantized activations: NVFP4 W4A4 (the routing and GEMM1's epilogue quantize),
                                 # MXFP4 W4A4 split 3 ways as dependents
                                 (_bitplace(gluon=True), "w_nvfp4_a_nvfp4", "SWIGLUOAI"),
                                 (_bitplace(gluon=True).configure(block_m=16, block_n=64, block_k=128, num_warps=4,
                                                                  num_stages=3, split_k=3, pdl=1), "w_mxfp4_a_mxfp4",
                                  "SILU"),
                                 # persistent grids (one ring a program across its work items), a 2-slot ring so
                                 # that items wrap it: one warpgroup split 3 ways as dependents, two warpgroups
                                 (_bitplace(gluon=True).configure(block_m=16, block_n=64, block_k=128, num_warps=4,
                                                                  num_stages=2, split_k=3, pdl=2, persistent=1),
                                  "w_nvfp4", "SWIGLUOAI"),
                                 (_bitplace(gluon=True).configure(block_m=16, block_n=128, block_k=128, num_warps=4,
                                                                  num_stages=3, persistent=1), "w_mxfp4", "SILU"),
                                 # prefill by TMA (tiles' tma 1): block-gathered activation boxes, K's tail and
                                 # rows past the tensor zero-filled; bf16 weights interleaved (one 256-row box) and
                                 # in halves; the bit-placement loop's activations
                                 (TritonEmulationBackend().configure(**_PREFILL_BF16_TMA), "bf16", "SWIGLUOAI"),
                                 (TritonEmulationBackend().configure(**_PREFILL_BF16_TMA), "bf16", "SILU"),
                                 # the loop warp-specialized by Triton (warp_spec: producer and two consumer
                                 # warpgroups, descriptors made on the device), gate and up rows in halves
                                 (TritonEmulationBackend().configure(**{**_PREFILL_BF16_TMA, "num_warps": 4, "num_stages": 2},
                                                                     warp_spec=1), "bf16", "SILU"),
                                 (_bitplace().configure(**_PREFILL_FP4_TMA), "w_mxfp4", "SWIGLUOAI"),
                                 (_bitplace().configure(**_PREFILL_FP4_TMA), "w_nvfp4_a_nvfp4", "SILU"),
                                 # block scales a K step ahead by plain loads (scale_regs: rows past N read the
                                 # last row's words, the first and last chunks' addresses), split 3 ways too
                                 (_bitplace().configure(block_m=32, block_n=64, block_k=128, num_warps=4,
                                                        num_stages=3, group_m=2, scale_regs=1), "w_nvfp4_a_nvfp4",
                                  "SILU"),
                                 (_bitplace().configure(block_m=16, block_n=128, block_k=128, num_warps=8,
                                                        num_stages=3, split_k=3, scale_regs=1), "w_mxfp4",
                                  "SWIGLUOAI"),
                                 # tail_m: no expert fills a 32-row block here, every row in the tail launch
                                 (TritonEmulationBackend().configure(**{**_PREFILL_BF16_TMA, "block_m": 32},
                                                                     tail_m=16), "bf16", "SWIGLUOAI"),
                                 # the same as short blocks in the one launch (inline_tails), bf16 by TMA and the
                                 # bit-placement loop
                                 (TritonEmulationBackend().configure(**{**_PREFILL_BF16_TMA, "block_m": 32, "tma": 2},
                                                                     tail_m=16, inline_tails=1), "bf16", "SWIGLUOAI"),
                                 (_bitplace().configure(**{**_PREFILL_FP4_TMA, "block_m": 32, "tma": 0}, tail_m=16,
                                                        inline_tails=1), "w_mxfp4", "SILU")):
        ckpt = make_checkpoint(scheme, act, tail.num_experts, tail.hidden_size, tail.intermediate_size, seed=1,
                               with_bias=act == "SWIGLUOAI")
        x, w, ids = case_inputs(tail, 1)
        prep = backend.prepare(ckpt)
        if backend.name == "triton_bitplace":  # the bit-placement loop, not its fallback to the emulation decode
            assert prep.constexprs["BITPLACE"], prep.constexprs
        out = backend.forward(prep, x.cuda(), w.cuda(), ids.cuda())
        torch.cuda.synchronize()
        print(backend.name, scheme, act, "K tail", tuple(out.shape), bool(torch.isfinite(out).all()))
    # warp_spec with interleaved gate and up rows (read as row pairs: K a multiple of block_k)
    pairs = Shape(num_experts=4, hidden_size=192, intermediate_size=160, tokens=7, top_k=2)
    backend = TritonEmulationBackend().configure(**{**_PREFILL_BF16_TMA, "num_warps": 4, "num_stages": 2}, warp_spec=1)
    ckpt = make_checkpoint("bf16", "SWIGLUOAI", pairs.num_experts, pairs.hidden_size, pairs.intermediate_size, seed=1,
                           with_bias=True)
    x, w, ids = case_inputs(pairs, 1)
    out = backend.forward(backend.prepare(ckpt), x.cuda(), w.cuda(), ids.cuda())
    torch.cuda.synchronize()
    print(backend.name, "bf16 SWIGLUOAI warp_spec row pairs", tuple(out.shape), bool(torch.isfinite(out).all()))
    # the Gluon kernel's GEMM2 two steps an iteration (schedule 1, ungated): 3 chunks, a pair and the odd one;
    # split 2 ways, 2 and 1
    steps = Shape(num_experts=4, hidden_size=192, intermediate_size=384, tokens=7, top_k=2)
    for split in (1, 2):
        backend = _bitplace(gluon=True).configure(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=2,
                                                  split_k=split, mma_overlap=1)
        ckpt = make_checkpoint("w_mxfp4", "SWIGLUOAI", steps.num_experts, steps.hidden_size,
                               steps.intermediate_size, seed=1, with_bias=True)
        x, w, ids = case_inputs(steps, 1)
        out = backend.forward(backend.prepare(ckpt), x.cuda(), w.cuda(), ids.cuda())
        torch.cuda.synchronize()
        print(backend.name, "gluon GEMM2 two steps an iteration, split", split, tuple(out.shape),
              bool(torch.isfinite(out).all()))
    # the tile-major copy (tile_major: each 64-row tile's K steps one contiguous run, one TMA box a step): GEMM1's 2
    # chunks and GEMM2's 3, split 1 and 2 ways, two warpgroups a program (GEMM2's last program's second tile past its
    # 192 rows: TMA fills zeros), MXFP4 and NVFP4 scale boxes
    for block_n, split in ((64, 1), (64, 2), (128, 1)):
        backend = _bitplace(gluon=True).configure(block_m=16, block_n=block_n, block_k=128, num_warps=4, num_stages=2,
                                                  split_k=split, pdl=1, tile_major=1)
        ckpt = make_checkpoint("w_nvfp4" if block_n == 128 else "w_mxfp4", "SWIGLUOAI", steps.num_experts,
                               steps.hidden_size, steps.intermediate_size, seed=1, with_bias=True)
        x, w, ids = case_inputs(steps, 1)
        prep = backend.prepare(ckpt)
        assert "w13_tile_major" in prep.extras and "w2_tile_major" in prep.extras, sorted(prep.extras)
        out = backend.forward(prep, x.cuda(), w.cuda(), ids.cuda())
        torch.cuda.synchronize()
        print(backend.name, "gluon tile-major, block_n", block_n, "split", split, tuple(out.shape),
              bool(torch.isfinite(out).all()))
    # prefill blocks through the Gluon kernel (gluon_prefill: 64 or 128 pairs a block as the wgmma's N, the whole K a
    # program, the epilogue from the accumulators, a 4-warp producer): 600 tokens x 2 (1200 pairs: align_layouts'
    # blocks, partly filled), GEMM1's K of 1.5 chunks, GEMM2's last program's second tile past its 192 rows; MXFP4,
    # NVFP4 and NVFP4 W4A4 (GEMM2's input quantized in GEMM1's epilogue)
    # bf16 prefill through the Gluon kernel (gluon_bf16): the same 1200 pairs (300 an expert: two full 128-pair blocks
    # and a short one inline), gate and up rows interleaved (row pairs) at 128-pair blocks with tails, in halves at 64
    # on a persistent grid and at 128 with tails, ungated at 64 (GEMM1 of 256 outputs a program, its last 128 past its
    # 384 rows); GEMM2's one program of 256 outputs over 192 (TMA's zeros past them), its K 6 steps
    from harness.backends.triton_emulation import GLUON_BF16_TILES

    prefill = Shape(num_experts=4, hidden_size=192, intermediate_size=384, tokens=600, top_k=2)
    runs = [(f"gluon prefill {scheme} block_m {bm} block_n {block_n}", "SWIGLUOAI", scheme,
             _bitplace(gluon=True).configure(block_m=bm, block_n=block_n, block_k=128, num_warps=4, num_stages=3,
                                             maxnreg=168 if block_n == 128 else 128, group_m=4, gluon_prefill=1,
                                             tile_major=1))
            for bm, block_n, scheme in ((64, 128, "w_mxfp4"), (128, 128, "w_nvfp4"), (64, 64, "w_nvfp4_a_nvfp4"))]
    runs += [(f"gluon bf16 prefill {act} block_m {bm} persistent {persistent} tail_m {tail}", act, "bf16",
              TritonEmulationBackend().configure(**dict(GLUON_BF16_TILES, block_m=bm, num_stages=3, group_m=4,
                                                        persistent=persistent, tail_m=tail,
                                                        inline_tails=int(tail > 0))))
             for bm, act, persistent, tail in ((128, "SWIGLUOAI", 0, 64), (64, "SILU", 1, 0), (64, "SILU_NO_MUL", 0, 0),
                                               (128, "SILU", 1, 64))]
    for label, act, scheme, backend in runs:
        ckpt = make_checkpoint(scheme, act, prefill.num_experts, prefill.hidden_size, prefill.intermediate_size,
                               seed=1, with_bias=True)
        x, w, ids = case_inputs(prefill, 1)
        out = backend.forward(backend.prepare(ckpt), x.cuda(), w.cuda(), ids.cuda())
        torch.cuda.synchronize()
        kernels = [getattr(backend.last_compiled.get(g), "name", None) for g in ("w13", "w2")]
        print(backend.name, label, kernels, tuple(out.shape), bool(torch.isfinite(out).all()))
    # persistent grids of moe_gemm_kernel (tiles' persistent): 2 programs (a one-multiprocessor GPU, as far as the
    # launch knows), each looping over many tiles, the used blocks' count read on the device; with tails and by TMA
    from harness.backends import triton_emulation

    real_multiprocessors = triton_emulation.multiprocessors
    triton_emulation.multiprocessors = lambda dev: 1
    try:
        for backend, scheme, act in (
                (TritonEmulationBackend().configure(**{**_PREFILL_BF16_TMA, "block_m": 32, "tma": 2}, persistent=2),
                 "bf16", "SWIGLUOAI"),
                (_bitplace().configure(block_m=32, block_n=64, block_k=128, num_warps=4, num_stages=3, group_m=2,
                                       tail_m=16, persistent=2), "w_nvfp4_a_nvfp4", "SILU")):
            ckpt = make_checkpoint(scheme, act, tail.num_experts, tail.hidden_size, tail.intermediate_size, seed=1,
                                   with_bias=act == "SWIGLUOAI")
            x, w, ids = case_inputs(Shape(num_experts=4, hidden_size=160, intermediate_size=96, tokens=40, top_k=2), 1)
            out = backend.forward(backend.prepare(ckpt), x.cuda(), w.cuda(), ids.cuda())
            torch.cuda.synchronize()
            print(backend.name, scheme, act, "persistent", backend.last_launch["w13"][0], tuple(out.shape),
                  bool(torch.isfinite(out).all()))
    finally:
        triton_emulation.multiprocessors = real_multiprocessors
    # the routing at prefill (align_layouts' three launches): plain blocks, big and tail blocks, short blocks inline,
    # over chunk boundaries and idle experts
    from harness.backends.triton_emulation import align_layouts

    ids = torch.randint(0, 300, (1500, 8), generator=torch.Generator().manual_seed(3)).cuda()
    for block_m, tail_m, inline in ((128, 0, False), (128, 32, False), (128, 64, True)):
        layouts = align_layouts(ids, 384, block_m, tail_m, inline)
        torch.cuda.synchronize()
        print("align_layouts", block_m, tail_m, inline, [int((layout[1] >= 0).sum()) for layout in layouts])
    x = torch.randn(33, 128, device="cuda")
    b.quantize_mx(x, E2M1, ScaleMode.RCEIL)
    b.quantize_nvfp4(x, torch.tensor(0.01))
    b.quantize_fp8(x, E4M3FN, Granularity.PER_BLOCK, (1, 128), None)
    torch.cuda.synchronize()
    print("quantizers ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
