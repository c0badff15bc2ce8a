"""moe_align_kernel's steps (triton_emulation.FUSED_ALIGN_STEPS) timed at the decode points of make bench's models,
the old steps (16-slot sentinel stores, block experts by compares, ranks by compares) against the new (1024-slot
stores, block experts by expert, ranks from sorted keys) and each new step alone, after checking that every variant
gives the same arrays as _align_torch. Median of 20 CUDA-graph replays of 50 launches each, per launch.

    python3 results/gpu-issue28/run-31/align_steps.py
"""
import torch

import harness.backends.triton_emulation as te
from harness.bench.workloads import MODEL_SHAPES, routed_inputs

VARIANTS = {
    "old": dict(FILL=16, OWNER_BY_EXPERT=False, RANK_SORT=False),
    "fill": dict(FILL=1024, OWNER_BY_EXPERT=False, RANK_SORT=False),
    "fill+owner": dict(FILL=1024, OWNER_BY_EXPERT=True, RANK_SORT=False),
    "new": dict(FILL=1024, OWNER_BY_EXPERT=True, RANK_SORT=True),
}


def main():
    backend = te.TritonEmulationBackend()
    print(torch.cuda.get_device_name(), "| us a launch, median of 20 graph replays of 50 launches")
    print(f"{'model':14s} {'tokens':>6s} {'pairs':>5s} " + " ".join(f"{v:>11s}" for v in VARIANTS))
    for model, tokens in (("gpt-oss-120b", 1), ("gpt-oss-120b", 8), ("gpt-oss-120b", 64), ("kimi-k2", 1),
                          ("kimi-k2", 8), ("kimi-k2", 64), ("kimi-k2", 128)):
        shape = MODEL_SHAPES[model]
        _, _, ids = routed_inputs(shape, tokens, "cuda")
        want = backend._align_torch(ids.cpu(), shape.num_experts, 16)
        row = []
        for name, steps in VARIANTS.items():
            te.FUSED_ALIGN_STEPS.clear()
            te.FUSED_ALIGN_STEPS.update(steps)
            got = backend._align(ids, shape.num_experts, 16)
            same = all(torch.equal(g.cpu(), w) for g, w in zip(got, want))
            backend._align(ids, shape.num_experts, 16)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(50):
                    backend._align(ids, shape.num_experts, 16)
            times = []
            for _ in range(20):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                graph.replay()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1000 / 50)
            row.append(f"{sorted(times)[10]:9.2f}{'' if same else ' X'}")
        print(f"{model:14s} {tokens:6d} {ids.numel():5d} " + " ".join(f"{r:>11s}" for r in row), flush=True)
    print("X: the arrays differ from _align_torch's")


if __name__ == "__main__":
    main()
