"""One MoE forward of a backend at a model shape, for Nsight Compute (GPU only): warm-up forwards (compiles,
caches), then the forwards to profile, each bracketed by torch.cuda.profiler start/stop so that ncu can take
just those launches:

    ncu --profile-from-start off --kernel-name moe_gemm_kernel --clock-control none \\
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \\
        --section SchedulerStats --section MemoryWorkloadAnalysis \\
        python3 tools/ncu_moe.py --model gpt-oss-120b --scheme w_mxfp4 --backend triton_bitplace --tokens 8

(ncu reports each profiled launch: GEMM1 then GEMM2 of the forward.) Without ncu, `--kernels` prints the
torch profiler's table of every kernel one forward launches (after an L2 flush, as the bench times it) and the
CUDA-graph time of the forward:

    python3 tools/ncu_moe.py --model gpt-oss-120b --scheme w_mxfp4 --backend triton_kernels_ogs --tokens 1 --kernels
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from harness.bench import MODEL_SHAPES, capture, flush_l2, median_ms, model_launch  # noqa: E402
from harness.bench.diagnosis import kernel_table  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gpt-oss-120b", choices=sorted(MODEL_SHAPES))
    parser.add_argument("--scheme", default="w_mxfp4")
    parser.add_argument("--backend", default="triton_bitplace")
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--forwards", type=int, default=1, help="profiled forwards")
    parser.add_argument("--kernels", action="store_true", help="print each kernel's device time instead")
    args = parser.parse_args()
    _, launch = model_launch(MODEL_SHAPES[args.model], args.scheme, args.backend, args.tokens)
    for _ in range(3):
        launch()
    torch.cuda.synchronize()
    if args.kernels:
        table = kernel_table(launch, setup=flush_l2)
        replay, _ = capture(launch)
        graph_us = 1e3 * median_ms(replay)
        print(f"{args.backend} {args.model} {args.scheme} T={args.tokens}: CUDA graph {graph_us:.1f} us, "
              f"kernels {sum(t for *_, t in table):.1f} us")
        for name, count, us in table:
            print(f"  {us:9.1f} us  x{count:<3d} {name[:150]}")
        return 0
    for _ in range(args.forwards):
        torch.cuda.profiler.start()
        launch()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    print(f"{args.backend} {args.model} {args.scheme} T={args.tokens}: profiled {args.forwards} forward(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
