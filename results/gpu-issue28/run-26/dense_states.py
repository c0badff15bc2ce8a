"""Issue 28 run-26 (session 27): is the dense bf16 rate read alongside a prefill row (interleaved_median_ms) fair?
make bench's run-26 rows read the dense matmul at 643-774 TFLOP/s beside the 8192-token rows against 771 for the
run's anchor (read once, at 152 W). One process per model: the dense matmul's rate cold (20 rounds), sustained alone
(300 rounds: the power cap's steady state, the median of the last 100), the prefill graph sustained alone, both
interleaved as make bench now times them, and the dense rate sustained again; each with nvidia-smi's SM clock and
power sampled through it. If the dense matmul sustained alone is no faster than beside the row, the row's % of dense
is not flattered by the interleaving.

    python3 results/gpu-issue28/run-26/dense_states.py --model gpt-oss-120b --scheme bf16 --backend triton_emulation
"""
import argparse
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from harness.bench import MODEL_SHAPES, capture, dense_bf16_matmul, flush_l2, model_launch, moe_flops  # noqa: E402


class Clocks:
    def __enter__(self):
        self.p = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                                   "-lms", "50"], stdout=subprocess.PIPE, text=True)
        return self

    def __exit__(self, *exc):
        torch.cuda.synchronize()
        self.p.terminate()
        rows = [line.split(",") for line in self.p.communicate()[0].splitlines() if "," in line]
        self.text = (f"SM median {statistics.median(float(r[0]) for r in rows):.0f} MHz, power median "
                     f"{statistics.median(float(r[1]) for r in rows):.0f} W ({len(rows)} samples)") if rows else ""


def times_ms(fn, rounds):
    out = []
    for _ in range(rounds):
        flush_l2()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        out.append(s.elapsed_time(e))
    return out


def interleaved_median_ms(fns, rounds):
    """Each fn timed in turn within every round (what commit 2ba384d's make bench did, measured here and dropped)."""
    times = [[] for _ in fns]
    for _ in range(rounds):
        for fn, kept in zip(fns, times):
            kept += times_ms(fn, 1)
    return [statistics.median(kept) for kept in times]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, choices=sorted(MODEL_SHAPES))
    ap.add_argument("--scheme", required=True)
    ap.add_argument("--backend", required=True)
    ap.add_argument("--tokens", type=int, default=8192)
    args = ap.parse_args()
    shape = MODEL_SHAPES[args.model]
    _, launch = model_launch(shape, args.scheme, args.backend, args.tokens)
    replay, _ = capture(launch)
    dense, dense_flops = dense_bf16_matmul()
    moe_tf = lambda ms: moe_flops(shape, args.tokens) / (ms / 1e3) / 1e12  # noqa: E731
    dense_tf = lambda ms: dense_flops / (ms / 1e3) / 1e12  # noqa: E731
    times_ms(replay, 3)
    print(f"{args.model} {args.scheme} {args.backend} T={args.tokens}", flush=True)
    steps = (("dense cold, 20 rounds", lambda: dense_tf(statistics.median(times_ms(dense, 20)))),
             ("dense sustained, last 100 of 300", lambda: dense_tf(statistics.median(times_ms(dense, 300)[200:]))),
             ("prefill sustained, last 50 of 100", lambda: moe_tf(statistics.median(times_ms(replay, 100)[50:]))),
             ("interleaved 20 rounds", lambda: interleaved_median_ms((replay, dense), 20)),
             ("dense sustained again", lambda: dense_tf(statistics.median(times_ms(dense, 300)[200:]))))
    for label, fn in steps:
        with Clocks() as c:
            v = fn()
        if isinstance(v, list):
            v = f"prefill {moe_tf(v[0]):.0f} TFLOP/s, dense {dense_tf(v[1]):.0f} TFLOP/s -> {100 * moe_tf(v[0]) / dense_tf(v[1]):.1f}%"
        else:
            v = f"{v:.0f} TFLOP/s"
        print(f"  {label}: {v} | {c.text}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
