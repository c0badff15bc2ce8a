"""Issue 28 run-23: is the 128-row TMA defect of the bit-placement loop a race? run-22's bisect (tma128_bisect.py)
found it in GEMM2 alone (GEMM1, gated, 0 elements differ in every case; GEMM2, not gated, 2-7% of the outputs differ
in every case) and counted different numbers of wrong outputs for the same GEMM2 inputs in two runs. Kimi-K2's shape
at 2048 tokens, MXFP4, GEMM1 by pointers; GEMM2 with TMA activations repeated (bit for bit run to run?) and with
one launch parameter changed at a time (pipeline depth, MMA steps, warps, columns). Prints, a variant: outputs that
differ from the pointer-load forward, outputs that differ from the variant's first run, and the largest difference
relative to the largest output.
    python3 results/gpu-issue28/run-23/tma128_race.py          # ~1 min on the H200"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "run-22"))
import torch  # noqa: E402
from tma128_bisect import BASE, override  # noqa: E402  (lifts _gemm's refusal)

from harness.backends import load_backend  # noqa: E402
from harness.bench import device_checkpoint, routed_inputs  # noqa: E402
from harness.bench.workloads import ModelShape  # noqa: E402

VARIANTS = (("as refused (3 stages)", {}), ("2 stages", {"num_stages": 2}), ("4 stages", {"num_stages": 4}),
            ("1 stage", {"num_stages": 1}), ("mma_steps 2 (64-column boxes)", {"mma_steps": 2}),
            ("8 warps", {"num_warps": 8}), ("128 columns", {"block_n": 128}))
REPEATS = 3

shape = ModelShape("kimi-k2", 384, 8, 7168, 2048, "SILU", ("w_mxfp4",))
ckpt = device_checkpoint(shape, "w_mxfp4", "cuda")
be = load_backend("triton_bitplace")
prep = be.prepare(ckpt)
x, w, ids = routed_inputs(shape, 2048, "cuda")
w = w.float().contiguous()
want = be.configure(**BASE).forward(prep, x, w, ids)
scale = want.float().abs().max()
for name, change in VARIANTS:
    t0 = time.time()
    override.update(w13={"tma": 0}, w2=change)
    runs = []
    try:
        for _ in range(REPEATS):
            runs.append(be.configure(**BASE, tma=1).forward(prep, x, w, ids))
    except Exception as exc:  # noqa: BLE001 - a probe: report and go on
        print(f"{name}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
        continue
    ref_diff = [int((r.view(torch.int16) != want.view(torch.int16)).sum()) for r in runs]
    run_diff = [int((r.view(torch.int16) != runs[0].view(torch.int16)).sum()) for r in runs[1:]]
    worst = max(float((r.float() - want.float()).abs().max() / scale) for r in runs)
    print(f"{name}: differ from pointers {ref_diff}, from its first run {run_diff}, largest |diff| / max|out| "
          f"{worst:.3g} [{time.time() - t0:.0f} s]", flush=True)
