"""GPU timing for the benchmarks: a CUDA-event timer for pytest-benchmark, an L2 flush between rounds,
CUDA-graph capture, and the copy-bandwidth and dense-matmul anchors measured in the same run.

Each round replays a CUDA graph of the backend's launch (no host work, no syncs) after an L2 flush (a 256
MB write), timed with CUDA events: `--benchmark-timer=harness.bench.cuda_event_timer` makes
pytest-benchmark's own statistics (min, median, ...) GPU times. Backends without a graph-capturable launch
are timed the same way, eagerly.
"""

from __future__ import annotations

import functools
import subprocess
import time

import torch

from harness.platforms import has_gpu

__all__ = ["cuda_event_timer", "flush_l2", "capture", "median_ms", "round_times_ms", "SampledClocks", "time_against_dense",
           "SUSTAIN_S", "IDLE_S", "COLD_ROUNDS", "copy_bandwidth",
           "dense_bf16_matmul", "dense_bf16_tflops", "anchors",
           "GPU_STATE_FIELDS", "parse_gpu_state", "gpu_state"]

_T0: list = []


def cuda_event_timer() -> float:
    """Seconds on the GPU's clock since the first call: records a CUDA event and waits for it. Two calls
    around a launch measure the GPU time between them (what pytest-benchmark's round time becomes).
    Falls back to perf_counter without a GPU."""
    if not has_gpu():
        return time.perf_counter()
    ev = torch.cuda.Event(enable_timing=True)
    ev.record()
    ev.synchronize()
    if not _T0:
        _T0.append(ev)
        return 0.0
    return _T0[0].elapsed_time(ev) / 1e3


@functools.lru_cache(maxsize=1)
def _l2_buffer():
    return torch.empty(256 << 20, dtype=torch.uint8, device="cuda")


def flush_l2() -> None:
    """Write 256 MB (H200's L2 is 50 MB): the next round reads its weights from HBM."""
    if has_gpu():
        _l2_buffer().zero_()


def capture(fn, warmup: int = 2):
    """A CUDA graph of fn() (after warm-up launches on a side stream, as torch requires): returns
    (replay, the output tensor that each replay rewrites)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            out = fn()
    except Exception:
        # a failed capture keeps its private memory pool while the graph lives: release it, or every later
        # benchmark in the session runs out of memory
        graph.reset()
        del graph
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        raise
    return graph.replay, out


def median_ms(fn, rounds: int = 50, sync: bool = False, warm_s: float = 0.0, idle_s: float = 0.0) -> float:
    """Median CUDA-event time of fn() over rounds, each after an L2 flush (round_times_ms)."""
    times = sorted(round_times_ms(fn, rounds, sync, warm_s, idle_s))
    return times[len(times) // 2]


def round_times_ms(fn, rounds: int, sync: bool = False, warm_s: float = 0.0, idle_s: float = 0.0) -> list[float]:
    """CUDA-event times of fn(), round by round, each after an L2 flush (sync: the host waits for the flush before
    fn is launched, as tools/chain_timeline.py does). warm_s: first run fn the same way, untimed, until that many
    seconds of its GPU time have passed: a compute-bound kernel then runs where the board's power cap holds it (an
    H200's SM clock falls from 1980 to ~1550 MHz within a second of dense matmuls:
    results/gpu-issue28/run-26/dense_states.log). idle_s: first leave the GPU idle that long, so that the rounds
    start cold (its clocks back at their boost)."""
    times, warm_ms = [], 0.0
    if idle_s and has_gpu():
        torch.cuda.synchronize()
        time.sleep(idle_s)
    while len(times) < rounds:
        flush_l2()
        if sync and has_gpu():
            torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        if warm_ms < warm_s * 1e3:
            warm_ms += start.elapsed_time(end)
        else:
            times.append(start.elapsed_time(end))
    return times


class SampledClocks:
    """nvidia-smi's SM clock (MHz) and power (W) sampled every period_ms while the block runs; .summary says their
    medians afterwards ('' without samples)."""

    def __init__(self, period_ms: int = 20):
        self.period_ms, self.summary = period_ms, ""

    def __enter__(self):
        try:
            self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw",
                                          "--format=csv,noheader,nounits", "-lms", str(self.period_ms)],
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:  # no nvidia-smi: no samples
            self.proc = None
        return self

    def __exit__(self, *exc):
        if has_gpu():
            torch.cuda.synchronize()
        if self.proc is None:
            return
        self.proc.terminate()
        rows = []
        for line in self.proc.communicate()[0].splitlines():
            try:
                sm, power = (float(v) for v in line.split(","))
            except ValueError:  # '[N/A]' or a partial line
                continue
            rows.append((sm, power))
        if rows:
            sm, power = sorted(r[0] for r in rows), sorted(r[1] for r in rows)
            self.summary = (f"SM median {sm[len(sm) // 2]:.0f} MHz (min {sm[0]:.0f}), power median "
                            f"{power[len(power) // 2]:.0f} W ({len(rows)} samples)")


@functools.lru_cache(maxsize=1)
def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write of 2 GB, median), this GPU, now."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), rounds=20)
    return 2 * src.numel() / (ms / 1e3)


@functools.lru_cache(maxsize=1)
def dense_bf16_matmul():
    """(launch, FLOPs): the dense reference, a bf16 8192^3 torch.matmul on this GPU."""
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    return (lambda: a @ b), 2 * n**3


@functools.lru_cache(maxsize=None)
def dense_bf16_tflops(warm_s: float = 0.0) -> float:
    """bf16 dense matmul throughput (dense_bf16_matmul, median), this GPU, now: cold, or after warm_s seconds back to
    back (median_ms)."""
    launch, flops = dense_bf16_matmul()
    return flops / (median_ms(launch, rounds=20, warm_s=warm_s) / 1e3) / 1e12


SUSTAIN_S = 1.0  # seconds back to back before a sustained median: the power cap's steady state
IDLE_S = 1.0  # seconds idle before a cold median: the clocks back at their boost
COLD_ROUNDS = 5  # few, so that the cold rounds do not heat the board themselves (Kimi-K2's prefill: 15 ms a round)


def time_against_dense(fn, flops: int, rounds: int, dense=None) -> dict:
    """A compute-bound forward's FLOP rate against the dense bf16 matmul's (dense_bf16_matmul, or dense = (launch,
    FLOPs)), both read the same way in two regimes: cold (after IDLE_S s idle, COLD_ROUNDS rounds) and sustained
    (after SUSTAIN_S s back to back, rounds rounds). An H200 runs a dense matmul at ~790 TFLOP/s cold and ~690 at its
    700 W cap, and a forward that draws less power keeps higher clocks there (FP4 prefill ~1780 MHz, bf16 ~1450,
    the matmul ~1550: results/gpu-issue28/run-26/dense_states.log), so the two regimes answer different questions
    (the kernel at equal boost clocks; the kernel as the board sustains it) and may disagree: pct_dense is the lower.
    Cold first, so that it is cold; us is the sustained median (what a prefill-heavy server sees)."""
    launch, dense_flops = dense or dense_bf16_matmul()
    rate = lambda fl, ms: fl / (ms / 1e3) / 1e12  # noqa: E731
    cold_ms = median_ms(fn, rounds=COLD_ROUNDS, idle_s=IDLE_S)
    dense_cold = rate(dense_flops, median_ms(launch, rounds=COLD_ROUNDS, idle_s=IDLE_S))
    ms = median_ms(fn, rounds=rounds, warm_s=SUSTAIN_S)
    dense_sustained = rate(dense_flops, median_ms(launch, rounds=rounds, warm_s=SUSTAIN_S))
    pct_sustained = 100 * rate(flops, ms) / dense_sustained
    pct_cold = 100 * rate(flops, cold_ms) / dense_cold
    return dict(us=ms * 1e3, us_cold=cold_ms * 1e3, dense_sustained_tflops=dense_sustained,
                dense_cold_tflops=dense_cold, pct_dense_sustained=pct_sustained, pct_dense_cold=pct_cold,
                pct_dense=min(pct_sustained, pct_cold))


# which board and in what state: the same kernel and config measured 599, 625 and 693 us on three H200 loans
# whose copy bandwidth and dense matmul rate agreed within 1% (results/gpu-issue15-bitplace/probe-e5393e1)
GPU_STATE_FIELDS = ("uuid", "pci.bus_id", "driver_version", "clocks.sm", "clocks.max.sm", "clocks.mem", "power.draw",
                    "power.limit", "temperature.gpu", "clocks_throttle_reasons.active")


def parse_gpu_state(csv_text: str, uuid: str | None = None) -> dict:
    """nvidia-smi --query-gpu=GPU_STATE_FIELDS --format=csv,noheader output -> {field: value} of the GPU whose
    uuid holds `uuid` (the one torch uses), or of the only GPU listed; {} when none matches."""
    rows = [[v.strip() for v in line.split(",")] for line in csv_text.strip().splitlines() if line.strip()]
    rows = [r for r in rows if len(r) == len(GPU_STATE_FIELDS)]
    if uuid is not None:
        rows = [r for r in rows if uuid.lower() in r[0].lower()] or (rows if len(rows) == 1 else [])
    return dict(zip(GPU_STATE_FIELDS, rows[0])) if len(rows) == 1 else {}


def gpu_state() -> dict:
    """The board torch runs on and its clocks, power and throttle reasons now (nvidia-smi); {} without one."""
    try:
        text = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(GPU_STATE_FIELDS)}", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    uuid = str(getattr(torch.cuda.get_device_properties(0), "uuid", "")) or None if has_gpu() else None
    return parse_gpu_state(text, uuid)


@functools.lru_cache(maxsize=1)
def _gpu_state_once() -> tuple:
    return tuple(gpu_state().items())


def anchors() -> dict:
    """The run's reference points (measured now, on this GPU), and which board it is and its state right after
    they were first measured (clocks and power of a warm GPU)."""
    if not has_gpu():
        return {}
    return dict(device=torch.cuda.get_device_name(0), torch=torch.__version__,
                copy_tb_s=copy_bandwidth() / 1e12, dense_bf16_tflops=dense_bf16_tflops(), gpu=dict(_gpu_state_once()))
