"""Issue 28 run-25 (staged in session 26): why make bench's prefill time is ~12% above chain_timeline's graph-replay
wall time on the same machine and tree (gpt-oss-120b bf16, 8192 tokens: 3856 against 3430 us, run-24 bench-gptoss/
and align2/), while Kimi-K2's agree. One process, one checkpoint, one CUDA graph, timed four ways in turn:
  A median_ms (make bench's row: flush, start event, replay, end event; no sync between flush and replay)
  B the same with a sync after the flush (chain_timeline's pattern), CUDA events
  C pytest-benchmark's pedantic pattern (harness.bench.cuda_event_timer around the replay, setup=flush_l2)
  D chain_timeline's profiler wall (first kernel start to last kernel end)
and A again, with nvidia-smi's clocks, power and throttle reasons before and after each.

    python3 results/gpu-issue28/run-25/timing_methods.py --model gpt-oss-120b --scheme bf16 --backend triton_emulation
"""
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import torch  # noqa: E402

from chain_timeline import profiled_replays, timeline  # noqa: E402
from harness.bench import MODEL_SHAPES, model_case_parser, capture, flush_l2, median_ms, model_launch  # noqa: E402
from harness.bench.timing import cuda_event_timer, gpu_state  # noqa: E402


def state(label: str) -> None:
    s = gpu_state()
    print(f"  [{label}] SM {s.get('clocks.sm')} mem {s.get('clocks.mem')} power {s.get('power.draw')} "
          f"temp {s.get('temperature.gpu')} throttle {s.get('clocks_throttle_reasons.active')}", flush=True)


def pedantic_ms(replay, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        flush_l2()
        t0 = cuda_event_timer()
        replay()
        times.append(cuda_event_timer() - t0)
    return statistics.median(times) * 1e3


def profiler_wall_ms(replay, rounds: int) -> float:
    return statistics.median(timeline(r)[1] for r in profiled_replays(replay, rounds)) / 1e3


def main() -> int:
    ap = model_case_parser(__doc__)
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    _, launch = model_launch(MODEL_SHAPES[args.model], args.scheme, args.backend, args.tokens)
    replay, _ = capture(launch)
    for _ in range(3):
        flush_l2()
        replay()
    torch.cuda.synchronize()
    print(f"{args.model} {args.scheme} {args.backend} T={args.tokens}", flush=True)
    for label, ms in (("A median_ms", lambda: median_ms(replay, rounds=args.rounds)),
                      ("B synced", lambda: median_ms(replay, rounds=args.rounds, sync=True)),
                      ("C pedantic", lambda: pedantic_ms(replay, args.rounds)),
                      ("D profiler wall", lambda: profiler_wall_ms(replay, args.rounds)),
                      ("A median_ms again", lambda: median_ms(replay, rounds=args.rounds))):
        state(f"before {label}")
        print(f"  {label}: {ms() * 1e3:.1f} us", flush=True)
    state("end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
