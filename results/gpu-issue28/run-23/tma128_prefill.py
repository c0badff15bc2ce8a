"""Issue 28 run-23: does the bit-placement loop's 128-row prefill tile gain from TMA activations where they are bit for
bit (tma128_race.py: 2 and 4 stages)? MXFP4, 8192 tokens, the prefill row (128 x 64 x 128, 4 warps, group_m 8, the
model's tail_m) with the activations by pointers at 3 stages (the row) and 4, and by TMA at 2 and 4 stages; each checked
bit for bit against the row, then timed as tune_moe times (the launch in a CUDA graph, median of 20 replays, each
after an L2 flush). Run-23 timed forward() instead (input checks included: 50 / 127 ms against make bench's 4.5 /
16.3), too coarse to compare the variants; its bit-for-bit column stands.
    python3 results/gpu-issue28/run-23/tma128_prefill.py          # ~1.5 min on the H200"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "run-22"))
import torch  # noqa: E402
from tma128_bisect import BASE  # noqa: E402  (lifts _gemm's refusal)

from harness.backends import load_backend  # noqa: E402
from harness.bench import device_checkpoint, routed_inputs  # noqa: E402
from harness.bench.timing import capture, median_ms  # noqa: E402
from harness.bench.workloads import ModelShape  # noqa: E402

VARIANTS = (("pointers, 3 stages (the row)", {}), ("pointers, 4 stages", {"num_stages": 4}),
            ("TMA, 2 stages", {"tma": 1, "num_stages": 2}), ("TMA, 4 stages", {"tma": 1, "num_stages": 4}))
for name, e, k, h, i, tail in (("gpt-oss-120b", 128, 4, 2880, 2880, 32), ("kimi-k2", 384, 8, 7168, 2048, 64)):
    shape = ModelShape(name, e, k, h, i, "SILU", ("w_mxfp4",))
    ckpt = device_checkpoint(shape, "w_mxfp4", "cuda")
    be = load_backend("triton_bitplace")
    prep = be.prepare(ckpt)
    x, w, ids = routed_inputs(shape, 8192, "cuda")
    w = w.float().contiguous()
    want = None
    for label, change in VARIANTS:
        t0 = time.time()
        cfg = be.configure(**{**BASE, "tail_m": tail, **change})
        try:
            got = cfg.forward(prep, x, w, ids)
        except Exception as exc:  # noqa: BLE001 - a probe: report and go on
            print(f"{name} {label}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            continue
        want = got if want is None else want
        same = bool(torch.equal(got.view(torch.int16), want.view(torch.int16)))
        replay, _ = capture(lambda: cfg.launch(prep, x, w, ids))
        ms = median_ms(replay, rounds=20)
        print(f"{name} {label}: {ms * 1000:.0f} us, bit for bit with the row {same} [{time.time() - t0:.0f} s]",
              flush=True)
    del ckpt, prep
    torch.cuda.empty_cache()
