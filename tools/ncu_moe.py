"""One MoE forward of a backend at a model shape, for Nsight Compute (GPU only): warm-up forwards (compiles,
caches), then the forwards to profile, each bracketed by torch.cuda.profiler start/stop so that ncu can take
just those launches:

    ncu --profile-from-start off --kernel-name moe_gemm_kernel --clock-control none \\
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \\
        --section SchedulerStats --section MemoryWorkloadAnalysis \\
        python3 tools/ncu_moe.py --model gpt-oss-120b --scheme w_mxfp4 --backend triton_bitplace --tokens 8

(ncu reports each profiled launch: GEMM1 then GEMM2 of the forward.)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from harness.backends import load_backend  # noqa: E402
from harness.bench import MODEL_SHAPES, device_checkpoint, routed_inputs  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gpt-oss-120b", choices=sorted(MODEL_SHAPES))
    parser.add_argument("--scheme", default="w_mxfp4")
    parser.add_argument("--backend", default="triton_bitplace")
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--forwards", type=int, default=1, help="profiled forwards")
    args = parser.parse_args()
    shape = MODEL_SHAPES[args.model]
    backend = load_backend(args.backend)
    prep = backend.prepare(device_checkpoint(shape, args.scheme, "cuda"))
    x, w, ids = routed_inputs(shape, args.tokens, "cuda")
    w = w.float().contiguous()
    for _ in range(3):
        backend.launch(prep, x, w, ids)
    torch.cuda.synchronize()
    for _ in range(args.forwards):
        torch.cuda.profiler.start()
        backend.launch(prep, x, w, ids)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    print(f"{args.backend} {args.model} {args.scheme} T={args.tokens}: profiled {args.forwards} forward(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
