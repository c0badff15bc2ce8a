"""Issue 28 run-25 (session 27): timing_methods.py found make bench's median_ms, a synced median, pytest-benchmark's
pattern and the profiler's wall within 2% of each other (gpt-oss-120b bf16 prefill 3364-3439 us), while make bench's
own row on the same loan read 3882 us. So the difference is in what make bench does around the timing, not in the
timing. This script repeats test_bench_moe's sequence step by step on one graph (checkpoint, prepare, eager forward,
capture, pytest-benchmark rounds, median_ms, the dense anchor) and a second graph captured without the eager forward,
and samples nvidia-smi's SM clock and power every 20 ms during each step.

    python3 results/gpu-issue28/run-25/bench_sequence.py --model gpt-oss-120b --scheme bf16 --backend triton_emulation
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from harness.backends import load_backend  # noqa: E402
from harness.bench import MODEL_SHAPES, model_case_parser, capture, device_checkpoint, flush_l2, median_ms, routed_inputs  # noqa: E402
from harness.bench.timing import SampledClocks, dense_bf16_tflops  # noqa: E402
from timing_methods import pedantic_ms  # noqa: E402  (pytest-benchmark's pattern, beside this script)


def step(label, fn):
    with SampledClocks(20) as c:
        value = fn()
    print(f"  {label}: {value} | {c.summary}", flush=True)


def pedantic(replay, rounds, warmup=2):
    for _ in range(warmup):
        flush_l2()
        replay()
    return f"{pedantic_ms(replay, rounds) * 1e3:.1f} us"


def main() -> int:
    ap = model_case_parser(__doc__)
    args = ap.parse_args()
    shape = MODEL_SHAPES[args.model]
    backend = load_backend(args.backend)
    prep = backend.prepare(device_checkpoint(shape, args.scheme, "cuda"))
    x, w, ids = routed_inputs(shape, args.tokens, "cuda")
    w = w.float().contiguous()
    print(f"{args.model} {args.scheme} {args.backend} T={args.tokens}", flush=True)
    us = lambda r: f"{median_ms(r, rounds=20) * 1e3:.1f} us"  # noqa: E731
    bare, _ = capture(lambda: backend.launch(prep, x, w, ids))  # captured with no eager forward before it
    step("bare graph median_ms", lambda: us(bare))
    eager = backend.forward(prep, x, w, ids)
    replay, out = capture(lambda: backend.launch(prep, x, w, ids))
    replay()
    torch.cuda.synchronize()
    print(f"  graph == eager: {torch.equal(out, eager)}")
    step("bench graph median_ms", lambda: us(replay))
    step("bench graph pytest-benchmark rounds", lambda: pedantic(replay, 20))
    step("bench graph median_ms after them", lambda: us(replay))
    step("dense bf16 anchor", lambda: f"{dense_bf16_tflops():.0f} TFLOP/s")
    step("bench graph median_ms after the anchor", lambda: us(replay))
    step("bare graph median_ms after all", lambda: us(bare))
    step("bench graph 200 rounds (hot)", lambda: us_n(replay, 200))
    step("bench graph median_ms after hot", lambda: us(replay))
    return 0


def us_n(replay, n):
    return f"{median_ms(replay, rounds=n) * 1e3:.1f} us"


if __name__ == "__main__":
    sys.exit(main())
