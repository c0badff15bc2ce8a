"""Benchmark support (suites/bench/, `make bench`): the shapes users run, checkpoints for them built on
the device, bytes and FLOPs that a MoE forward must move and do, a CUDA-event timer for pytest-benchmark,
an L2 flush between rounds, and the copy-bandwidth and dense-matmul anchors measured in the same run.

Timing: each round replays a CUDA graph of the backend's launch (no host work, no syncs) after an L2
flush (a 256 MB write), timed with CUDA events: `--benchmark-timer=harness.bench.cuda_event_timer`
makes pytest-benchmark's own statistics (min, median, ...) GPU times. Backends without a graph-capturable
launch are timed the same way, eagerly.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import torch

from reference.activations import activation_by_name
from reference.checkpoints import MoECheckpoint, QuantizedWeight
from reference.formats import E4M3FN
from reference.routing import RoutingConfig, route
from reference.schemes import scheme_by_name

__all__ = ["ModelShape", "MODEL_SHAPES", "TOKENS", "cuda_event_timer", "flush_l2", "device_checkpoint",
           "weight_bytes", "moe_flops", "copy_bandwidth", "dense_bf16_tflops", "routed_inputs", "capture"]


@dataclass(frozen=True)
class ModelShape:
    name: str
    num_experts: int
    top_k: int
    hidden_size: int
    intermediate_size: int
    activation: str
    schemes: tuple[str, ...]  # the quantization schemes benchmarked at this shape


MODEL_SHAPES = {
    s.name: s
    for s in (
        ModelShape("gpt-oss-120b", 128, 4, 2880, 2880, "SWIGLUOAI", ("w_mxfp4", "w_nvfp4", "w_nvfp4_a_nvfp4", "bf16")),
        ModelShape("kimi-k2", 384, 8, 7168, 2048, "SILU", ("w_mxfp4", "w_nvfp4", "bf16", "w_fp8_a_fp8")),
        ModelShape("qwen3-30b-a3b", 128, 8, 2048, 768, "SILU", ("w_nvfp4", "w_mxfp4", "bf16")),
    )
}
TOKENS = (1, 8, 64, 512, 8192)
# On a CPU the benchmark tests run once, as correctness checks, at this shape (the interpreter is slow)
CPU_SHAPE = ModelShape("cpu-check", 8, 2, 128, 128, "SILU", ())


# ---- timing ------------------------------------------------------------------------------------------


_T0: list = []


def cuda_event_timer() -> float:
    """Seconds on the GPU's clock since the first call: records a CUDA event and waits for it. Two calls
    around a launch measure the GPU time between them (what pytest-benchmark's round time becomes).
    Falls back to perf_counter without a GPU."""
    if not torch.cuda.is_available():
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
    if torch.cuda.is_available():
        _l2_buffer().zero_()


def capture(fn, warmup: int = 2):
    """A CUDA graph of fn() (after warm-up launches on a side stream, as torch requires); returns replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def median_ms(fn, rounds: int = 50) -> float:
    """Median CUDA-event time of fn() over rounds, each after an L2 flush."""
    times = []
    for _ in range(rounds):
        flush_l2()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


@functools.lru_cache(maxsize=1)
def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write of 2 GB, median), this GPU, now."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), rounds=20)
    return 2 * src.numel() / (ms / 1e3)


@functools.lru_cache(maxsize=1)
def dense_bf16_tflops() -> float:
    """bf16 dense matmul throughput (8192^3, torch.matmul, median), this GPU, now."""
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms = median_ms(lambda: a @ b, rounds=20)
    return 2 * n**3 / (ms / 1e3) / 1e12


# ---- what a forward must move and compute ------------------------------------------------------------


def weight_bytes(ckpt: MoECheckpoint, topk_ids: torch.Tensor) -> int:
    """Bytes of the activated experts' weights, block scales and biases: each must be read at least once."""
    used = int(torch.unique(topk_ids).numel())
    total = 0
    for w, b in ((ckpt.w13, ckpt.b13), (ckpt.w2, ckpt.b2)):
        per_expert = w.data[0].numel() * w.data.element_size()
        if w.scale is not None and w.scale.dim() > 1:
            per_expert += w.scale[0].numel() * w.scale.element_size()
        if b is not None:
            per_expert += b[0].numel() * b.element_size()
        total += per_expert * used
    return total


def moe_flops(shape: ModelShape, tokens: int) -> int:
    act = activation_by_name(shape.activation)
    n13 = (2 if act.gated else 1) * shape.intermediate_size
    return 2 * tokens * shape.top_k * (n13 * shape.hidden_size + shape.hidden_size * shape.intermediate_size)


def io_bytes(shape: ModelShape, tokens: int) -> int:
    """Activations in and out (bf16) and the routing (fp32 weights, int64 ids)."""
    return tokens * shape.hidden_size * 2 * 2 + tokens * shape.top_k * (4 + 8)


# ---- inputs ------------------------------------------------------------------------------------------


def routed_inputs(shape: ModelShape, tokens: int, device, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(tokens, shape.hidden_size, generator=g)).to(torch.bfloat16)
    w, ids = route(torch.randn(tokens, shape.num_experts, generator=g), RoutingConfig(top_k=shape.top_k))
    return x.to(device), w.to(device), ids.to(device)


def device_checkpoint(shape: ModelShape, scheme_name: str, device, seed: int = 0) -> MoECheckpoint:
    """A checkpoint of the full model shape built directly on the device from random codes (a reference
    quantization of 10^10 weights would take minutes on the host and changes nothing about the time).
    Codes are drawn so that values are finite and scales moderate; correctness is checked separately, at
    a small shape, against the reference (suites/bench)."""
    scheme = scheme_by_name(scheme_name)
    act = activation_by_name(shape.activation)
    e, h, i = shape.num_experts, shape.hidden_size, shape.intermediate_size
    n13 = 2 * i if act.gated else i
    g = torch.Generator(device=device).manual_seed(seed)
    wq = scheme.weight

    def weight(rows: int, cols: int) -> QuantizedWeight:
        if wq is None:
            return QuantizedWeight((torch.randn(e, rows, cols, generator=g, device=device) * 0.02).to(torch.bfloat16))
        if wq.kind in ("mx", "nvfp4") and wq.elem.nbits == 4:
            data = torch.randint(0, 256, (e, rows, cols // 2), generator=g, device=device, dtype=torch.uint8)
        elif wq.kind == "mx":  # MXFP8/MXFP6 codes: one per byte, NaN-free
            data = _fp8_codes((e, rows, cols), g, device)
        else:  # FP8
            data = _fp8_codes((e, rows, cols), g, device)
        if wq.kind == "mx":
            scale = torch.randint(118, 124, (e, rows, cols // 32), generator=g, device=device, dtype=torch.uint8)
            return QuantizedWeight(data, scale)
        if wq.kind == "nvfp4":
            # E4M3 block-scale codes 0x30..0x47: 0.5 .. 2.0
            scale = torch.randint(0x30, 0x48, (e, rows, cols // 16), generator=g, device=device, dtype=torch.uint8)
            return QuantizedWeight(data, scale, torch.full((e,), 0.01, device=device))
        if wq.granularity.name == "PER_TENSOR":
            return QuantizedWeight(data, torch.full((e,), 0.01, device=device))
        return QuantizedWeight(data, torch.full((e, rows // 128, cols // 128), 0.01, device=device))

    bias = act.name == "SWIGLUOAI"
    return MoECheckpoint(
        scheme, act, weight(n13, h), weight(h, i), h, i,
        b13=torch.zeros(e, n13, device=device) if bias else None,
        b2=torch.zeros(e, h, device=device) if bias else None,
        w13_input_scale=torch.full((e,), 0.05, device=device) if scheme.act is not None else None,
        w2_input_scale=torch.full((e,), 0.05, device=device) if scheme.act is not None else None,
        fp8_format=E4M3FN,
    )


def _fp8_codes(size, g, device) -> torch.Tensor:
    """E4M3FN codes of moderate magnitude (exponent field 4..10), random signs and mantissas: no NaN."""
    mant = torch.randint(0, 8, size, generator=g, device=device, dtype=torch.uint8)
    exp = torch.randint(4, 11, size, generator=g, device=device, dtype=torch.uint8)
    sign = torch.randint(0, 2, size, generator=g, device=device, dtype=torch.uint8)
    return (sign << 7) | (exp << 3) | mant


def roofline_time_s(nbytes: int, flops: int, bandwidth: float, tflops: float) -> float:
    """The lower bound on time from bytes and FLOPs alone."""
    return max(nbytes / bandwidth, flops / (tflops * 1e12))

