"""The kernels of one CUDA-graph replay of a forward on a time line: each kernel's start after the replay's first
kernel, its duration and its gap after the kernel before (negative: it overlapped, as programmatic dependent
launches do), so that the time a chain of launches loses between its kernels is seen, not inferred from a sum.

    python3 tools/chain_timeline.py --model gpt-oss-120b --tokens 1 --backend triton_bitplace_gluon \
        --scheme w_nvfp4 --scheme w_nvfp4_a_nvfp4 [--replays 20] [--config block_m=128 --config tail_m=32 ...]

The bench's setting: the model's full checkpoint on the device, its routing, the backend's own tiles (--config: the
launch parameters given instead, as tools/bit_for_bit.py takes them), a CUDA graph of the launch, an L2 flush before
each replay (outside the time line). The profiler's trace of the replays (CUPTI records each kernel node of a graph)
is read back; the replay whose wall time is the median is printed, with the median wall time, kernel time and gap
time over all replays.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from harness.bench import MODEL_SHAPES, capture, flush_l2, model_launch  # noqa: E402


def replay_kernels(trace_events: list[dict]) -> list[list[tuple[str, float, float]]]:
    """The trace's kernels (name, start us, duration us) cut into replays: each replay is the kernels after one L2
    flush (flush_l2's 256 MB fill: a memset, or torch's fill kernel (FillFunctor) of at least a quarter of the
    longest fill's time) and before the next. (Not any name with "fill" in it: bf16_prefill_kernel, 1-3 ms, once
    cut every replay at its GEMMs and left them out of the time line.)"""
    events = sorted((e for e in trace_events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memset")),
                    key=lambda e: float(e["ts"]))

    def is_fill(e) -> bool:
        return e["cat"] == "gpu_memset" or "FillFunctor" in e["name"]

    fill = [float(e["dur"]) for e in events if is_fill(e)]
    if not fill:
        raise RuntimeError("no L2 flush (a memset or fill kernel) in the trace: "
                           f"{sorted({e['name'][:40] for e in events})}")
    runs: list[list[tuple[str, float, float]]] = []
    for e in events:
        if is_fill(e) and float(e["dur"]) >= max(fill) / 4:
            runs.append([])  # a flush: the next replay starts
        elif runs and e["cat"] == "kernel":
            runs[-1].append((e["name"], float(e["ts"]), float(e["dur"])))
    return [r for r in runs if r]


def timeline(kernels: list[tuple[str, float, float]]) -> tuple[list[str], float, float]:
    """Lines of one replay (start, duration, gap, name) and its (wall, summed kernel) time in us."""
    t0, lines, end = kernels[0][1], [], None
    for name, ts, dur in kernels:
        gap = "" if end is None else f"{ts - end:+8.1f}"
        lines.append(f"  {ts - t0:8.1f} {dur:8.1f} {gap:>8}  {name[:110]}")
        end = ts + dur if end is None else max(end, ts + dur)
    return lines, end - t0, sum(k[2] for k in kernels)


def profiled_replays(replay, replays: int) -> list[list[tuple[str, float, float]]]:
    """The kernels of `replays` graph replays (replay_kernels), each after an L2 flush the host waits for, recorded
    by the profiler after three warm replays."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        flush_l2()
        replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            flush_l2()
            torch.cuda.synchronize()
            replay()
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        prof.export_chrome_trace(f"{tmp}/trace.json")
        return replay_kernels(json.loads(Path(f"{tmp}/trace.json").read_text())["traceEvents"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, choices=sorted(MODEL_SHAPES))
    ap.add_argument("--scheme", action="append", required=True)
    ap.add_argument("--tokens", type=int, default=1)
    ap.add_argument("--backend", required=True)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--config", action="append", default=[], metavar="KEY=INT")
    ap.add_argument("--sweep", metavar="NAME=V1,V2,...",
                    help="an integer constant of harness.backends.triton_bitplace (GLUON_STAGES, GLUON_W2_BLOCK_N, ...) set "
                         "to each value in turn, the graph captured again and timed each time, the checkpoint built "
                         "once (A/B runs in one process; repeat a value, 0,4,0,4, to see the drift)")
    args = ap.parse_args(argv)
    config = {k: int(v) for k, v in (c.split("=", 1) for c in args.config)}
    sweep = [(None, None)]
    if args.sweep:
        from harness.backends import triton_bitplace

        name, values = args.sweep.split("=", 1)
        if not isinstance(getattr(triton_bitplace, name, None), (int, bool)):
            ap.error(f"--sweep: {name} is no integer constant of harness.backends.triton_bitplace")
        sweep = [(name, int(v)) for v in values.split(",")]
    shape = MODEL_SHAPES[args.model]
    for scheme in args.scheme:
        backend, launch = model_launch(shape, scheme, args.backend, args.tokens)
        if config:
            backend.configure(**config)
        for name, value in sweep:
            label = f"{args.model} {scheme} T={args.tokens} {args.backend}{' ' + str(config) if config else ''}"
            if name is not None:
                setattr(triton_bitplace, name, value)  # read by tile_config at each forward, so at each capture
                label += f" {name}={value}"
            replay, _ = capture(launch)
            runs = profiled_replays(replay, args.replays)
            if len(runs) != args.replays or len({len(r) for r in runs}) != 1:
                print(f"warning: {len(runs)} replays of {sorted({len(r) for r in runs})} kernels in the trace, "
                      f"{args.replays} expected", flush=True)
            walls = [timeline(r)[1] for r in runs]
            median = sorted(range(len(runs)), key=lambda i: walls[i])[len(runs) // 2]
            lines, wall, busy = timeline(runs[median])
            print(f"{label}: median replay {statistics.median(walls):.1f} us wall, kernels {busy:.1f} us summed "
                  f"({len(runs[median])} kernels)\n     start      dur      gap  kernel")
            print("\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
