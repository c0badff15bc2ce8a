"""Does a benchmark case's time depend on the case that ran before it? (H200, 2026-12-01: in `make bench`
the triton_bitplace rows that ran right after a dequantize_all case were 12-17% slower than the same
config in tools/tune_moe.py; the rows that did not follow one agreed within 2%. Answer, measured with this
tool: no; the same case gave the same time in every state here, and the spread was between loans of the
machine: results/gpu-issue15-bitplace/probe-e5393e1.)

One decode case (default Kimi-K2, MXFP4, 8 tokens, triton_bitplace) is timed as the benchmark times it
(CUDA-graph replay after an L2 flush, median) in four states, with the SM clock, memory clock, power,
temperature and active throttle reasons from nvidia-smi beside each:

    fresh        after the checkpoint and its preparation only
    after-heavy  right after --heavy-seconds of the dequantize-all baseline (what precedes it in make bench)
    rested       after --rest seconds idle
    settled      after replaying the case itself for --settle seconds

    python3 tools/probe_bench_order.py [--model kimi-k2] [--scheme w_mxfp4] [--tokens 8]   # JSON to $OUT
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from harness.backends import load_backend  # noqa: E402
from harness.bench import MODEL_SHAPES, capture, copy_bandwidth, device_checkpoint, median_ms, routed_inputs, weight_bytes  # noqa: E402
from harness.bench.report import finish_tool  # noqa: E402
from harness.bench.timing import gpu_state as _gpu_state  # noqa: E402

SHOWN = ("clocks.sm", "clocks.mem", "power.draw", "temperature.gpu", "clocks_throttle_reasons.active")


def gpu_state() -> str:
    state = _gpu_state()
    return ", ".join(state.get(k, "?") for k in SHOWN) if state else "nvidia-smi unavailable"


def spin(fn, seconds: float) -> int:
    calls, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        fn()
        torch.cuda.synchronize()
        calls += 1
    return calls


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="kimi-k2", choices=list(MODEL_SHAPES))
    ap.add_argument("--scheme", default="w_mxfp4")
    ap.add_argument("--backend", default="triton_bitplace")
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--heavy-seconds", type=float, default=3.0)
    ap.add_argument("--rest", type=float, default=5.0)
    ap.add_argument("--settle", type=float, default=2.0)
    args = ap.parse_args()
    bw = copy_bandwidth()
    shape = MODEL_SHAPES[args.model]
    ckpt = device_checkpoint(shape, args.scheme, "cuda")
    x, w, ids = routed_inputs(shape, args.tokens, "cuda")
    w = w.float().contiguous()
    nbytes = weight_bytes(ckpt, ids)
    backend, baseline = load_backend(args.backend), load_backend("dequantize_all")
    prep, base_prep = backend.prepare(ckpt), baseline.prepare(ckpt)
    replay, _ = capture(lambda: backend.launch(prep, x, w, ids))
    rows = []

    def measure(state: str, before: str) -> None:
        ms = median_ms(replay, rounds=20)
        row = dict(state=state, us=ms * 1e3, pct_copy=100 * nbytes / (ms / 1e3) / bw, gpu_before=before,
                   gpu_after=gpu_state())
        rows.append(row)
        print(f"{state:<12} {row['us']:8.1f} us {row['pct_copy']:5.1f}% of copy | before: {before} | after: "
              f"{row['gpu_after']}", flush=True)

    print(f"{args.model} {args.scheme} T={args.tokens} {args.backend}; nvidia-smi: {','.join(SHOWN)}; board "
          f"{_gpu_state().get('uuid', '?')}; copy {bw / 1e12:.2f} TB/s")
    measure("fresh", gpu_state())
    calls = spin(lambda: baseline.forward(base_prep, x, w, ids), args.heavy_seconds)
    measure("after-heavy", f"{calls} dequantize-all forwards; " + gpu_state())
    time.sleep(args.rest)
    measure("rested", gpu_state())
    spin(lambda: baseline.forward(base_prep, x, w, ids), args.heavy_seconds)
    calls = spin(replay, args.settle)
    measure("settled", f"heavy again, then {calls} replays; " + gpu_state())
    return finish_tool("bench_order.json", bw, rows)


if __name__ == "__main__":
    sys.exit(main())
