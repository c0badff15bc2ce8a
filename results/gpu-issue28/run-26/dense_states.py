"""Issue 28 run-26 (session 27): is the dense bf16 rate read alongside a prefill row (interleaved_median_ms) fair?
make bench's run-26 rows read the dense matmul at 643-774 TFLOP/s beside the 8192-token rows against 771 for the
run's anchor (read once, at 152 W). One process per model: the dense matmul's rate cold (20 rounds), sustained alone
(300 rounds: the power cap's steady state, the median of the last 100), the prefill graph sustained alone, both
interleaved as make bench now times them, and the dense rate sustained again; each with nvidia-smi's SM clock and
power sampled through it. If the dense matmul sustained alone is no faster than beside the row, the row's % of dense
is not flattered by the interleaving.

    python3 results/gpu-issue28/run-26/dense_states.py --model gpt-oss-120b --scheme bf16 --backend triton_emulation
"""
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from harness.bench import MODEL_SHAPES, model_case_parser, capture, dense_bf16_matmul, model_launch, moe_flops  # noqa: E402
from harness.bench.timing import SampledClocks, round_times_ms  # noqa: E402


def interleaved_median_ms(fns, rounds):
    """Each fn timed in turn within every round (what commit 2ba384d's make bench did, measured here and dropped)."""
    times = [[] for _ in fns]
    for _ in range(rounds):
        for fn, kept in zip(fns, times):
            kept += round_times_ms(fn, 1)
    return [statistics.median(kept) for kept in times]


def main() -> int:
    ap = model_case_parser(__doc__)
    args = ap.parse_args()
    shape = MODEL_SHAPES[args.model]
    _, launch = model_launch(shape, args.scheme, args.backend, args.tokens)
    replay, _ = capture(launch)
    dense, dense_flops = dense_bf16_matmul()
    moe_tf = lambda ms: moe_flops(shape, args.tokens) / (ms / 1e3) / 1e12  # noqa: E731
    dense_tf = lambda ms: dense_flops / (ms / 1e3) / 1e12  # noqa: E731
    round_times_ms(replay, 3)
    print(f"{args.model} {args.scheme} {args.backend} T={args.tokens}", flush=True)
    steps = (("dense cold, 20 rounds", lambda: dense_tf(statistics.median(round_times_ms(dense, 20)))),
             ("dense sustained, last 100 of 300", lambda: dense_tf(statistics.median(round_times_ms(dense, 300)[200:]))),
             ("prefill sustained, last 50 of 100", lambda: moe_tf(statistics.median(round_times_ms(replay, 100)[50:]))),
             ("interleaved 20 rounds", lambda: interleaved_median_ms((replay, dense), 20)),
             ("dense sustained again", lambda: dense_tf(statistics.median(round_times_ms(dense, 300)[200:]))))
    for label, fn in steps:
        with SampledClocks(50) as c:
            v = fn()
        if isinstance(v, list):
            v = f"prefill {moe_tf(v[0]):.0f} TFLOP/s, dense {dense_tf(v[1]):.0f} TFLOP/s -> {100 * moe_tf(v[0]) / dense_tf(v[1]):.1f}%"
        else:
            v = f"{v:.0f} TFLOP/s"
        print(f"  {label}: {v} | {c.summary}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
