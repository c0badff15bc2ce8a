"""Issue 28 run-16: where prefill by TMA (tiles' tma 1) differs from tma 0 in bf16 (run-15: max |diff| 0.0156 /
0.0312 at 2048 tokens, while MXFP4 / NVFP4 W4A4 were bit for bit). Each GEMM alone: GEMM1 by TMA with GEMM2 not,
and GEMM2 by TMA fed tma 0's GEMM1 output; how many outputs differ, by how many bf16 ulps, whether tma 1 repeats
itself across runs and pipeline depths, and for GEMM2 (no activation: z = bf16(a2 @ w2^T)) which of the two is
nearer the fp64 product where they differ.
    python3 results/gpu-issue28/run-16/tma_bits.py
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import torch  # noqa: E402

from harness.backends import load_backend  # noqa: E402
from harness.bench import CPU_SHAPE, MODEL_SHAPES, routed_inputs  # noqa: E402
from reference.checkpoints import make_checkpoint  # noqa: E402

TILES = dict(block_m=16, block_n=64, block_k=64, num_warps=4, num_stages=2) if sys.argv[1:] == ["cpu"] else dict(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=4, group_m=8)


def ulps(a, b):
    ia, ib = a.view(torch.int16).int(), b.view(torch.int16).int()
    ia = torch.where(ia < 0, -32768 - ia, ia)  # sign-magnitude to a monotone integer line
    ib = torch.where(ib < 0, -32768 - ib, ib)
    return (ia - ib).abs()


CPU = sys.argv[1:] == ["cpu"]  # the interpreter's small shape: the scripts' own smoke test (nothing differs)
DEV, T = ("cpu", 64) if CPU else ("cuda", 2048)


def bf16_cases():
    """(model, triton_emulation, its prepared bf16 checkpoint of 8 experts, x, weights, ids) of each model (also
    tma_where.py's)."""
    for model in (["cpu"] if CPU else ["gpt-oss-120b", "kimi-k2"]):
        shape = CPU_SHAPE if CPU else MODEL_SHAPES[model]
        ckpt = make_checkpoint("bf16", shape.activation, 8, shape.hidden_size, shape.intermediate_size, seed=0,
                               with_bias=shape.biased)
        be = load_backend("triton_emulation")
        x, w, _ = routed_inputs(shape, T, DEV)
        ids = torch.randn(T, 8, generator=torch.Generator().manual_seed(T)).topk(shape.top_k).indices.to(DEV)
        yield model, be, be.prepare(ckpt), x, w.float().contiguous(), ids


def main():
    for model, be, prep, x, w, ids in bf16_cases():
        gemm = be._gemm
        rec = {}

        def run(tma_w13, tma_w2, stages=4, feed_y=None):
            def spy(prep_, which, a, *args, tiles, **kw):
                tiles = dict(tiles, tma=tma_w13 if which == "w13" else tma_w2)
                if which == "w2" and feed_y is not None:
                    a = feed_y
                r = gemm(prep_, which, a, *args, tiles=tiles, **kw)
                rec[which] = (a.clone(), args[2].clone())  # input and out
                return r
            be._gemm = spy
            be.configure(**{**TILES, "num_stages": stages})
            out = be.forward(prep, x, w, ids)
            be._gemm = gemm
            return out, rec["w13"][1].clone(), rec["w2"][1].clone(), rec["w2"][0]

        out0, y0, z0, a2_0 = run(0, 0)
        for label, (t1, t2, st, feed) in {"GEMM1 by TMA": (1, 0, 4, None), "GEMM2 by TMA (tma 0's y)": (0, 1, 4, y0),
                                          "both, 4 stages": (1, 1, 4, None), "both, 4 stages again": (1, 1, 4, None),
                                          "both, 3 stages": (1, 1, 3, None), "both, 2 stages": (1, 1, 2, None),
                                          "tma 0, 3 stages": (0, 0, 3, None)}.items():
            out, y, z, a2 = run(t1, t2, st, feed)
            dy, dz = ulps(y, y0), ulps(z, z0)
            line = (f"{model} {label}: y differs at {(dy > 0).sum().item()} of {dy.numel()} (max {dy.max().item()} ulp), "
                    f"z at {(dz > 0).sum().item()} (max {dz.max().item()} ulp), out at {(ulps(out, out0) > 0).sum().item()}")
            if label.startswith("GEMM2"):
                # which is nearer the fp64 product where they differ: z rows are pairs in topk_ids order
                bad = (dz > 0).nonzero()[:4096]
                if len(bad) or CPU:
                    bad = bad if len(bad) else torch.stack([torch.arange(8), torch.arange(8)], 1).to(DEV)
                    pair, col = bad[:, 0], bad[:, 1]
                    expert = ids.flatten()[pair]
                    w2 = prep.w2.view(prep.w2.shape[0], -1, a2.shape[1])  # [E, H, I]
                    exact = (a2[pair].double() * w2[expert, col].double()).sum(-1)
                    if prep.b2 is not None:
                        exact = exact + prep.b2[expert, col].double()
                    e0 = (z0[pair, col].double() - exact).abs()
                    e1 = (z[pair, col].double() - exact).abs()
                    line += (f"; of {len(bad)} differing, tma 1 nearer the fp64 sum at {(e1 < e0).sum().item()}, "
                             f"tma 0 at {(e0 < e1).sum().item()} (largest relative error {(e0 / exact.abs()).max().item():.2g} / "
                             f"{(e1 / exact.abs()).max().item():.2g})")
            print(line, flush=True)


if __name__ == "__main__":
    main()
