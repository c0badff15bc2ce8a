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

from harness.platforms import has_gpu
from reference.activations import activation_by_name
from reference.checkpoints import MoECheckpoint, QuantizedWeight
from reference.formats import E4M3FN
from reference.quantizers import MX, NVFP4
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
    biased: bool = False  # the model's experts carry biases (gpt-oss)


MODEL_SHAPES = {
    s.name: s
    for s in (
        ModelShape("gpt-oss-120b", 128, 4, 2880, 2880, "SWIGLUOAI", ("w_mxfp4", "w_nvfp4", "w_nvfp4_a_nvfp4", "bf16"),
                   biased=True),
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
    with torch.cuda.graph(graph):
        out = fn()
    return graph.replay, out


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
        if wq is None:  # drawn in bf16 directly: Kimi-K2's w13 in fp32 alone would be 42 GB
            return QuantizedWeight(torch.randn(e, rows, cols, generator=g, device=device, dtype=torch.bfloat16).mul_(0.02))
        return QuantizedWeight(*wq.kind.random_weight(wq, e, rows, cols, g, device, E4M3FN))

    bias = shape.biased
    return MoECheckpoint(
        scheme, act, weight(n13, h), weight(h, i), h, i,
        b13=torch.zeros(e, n13, device=device) if bias else None,
        b2=torch.zeros(e, h, device=device) if bias else None,
        w13_input_scale=torch.full((e,), 0.05, device=device) if scheme.act is not None else None,
        w2_input_scale=torch.full((e,), 0.05, device=device) if scheme.act is not None else None,
        fp8_format=E4M3FN,
    )


def roofline_time_s(nbytes: int, flops: int, bandwidth: float, tflops: float) -> float:
    """The lower bound on time from bytes and FLOPs alone."""
    return max(nbytes / bandwidth, flops / (tflops * 1e12))



# ---- the dequantize-everything baseline --------------------------------------------------------------


class DequantizeAllBaseline:
    """torch_emulation's method (and vLLM's OCP MX emulation's) on the device: in every forward, all
    experts' weights are dequantized to bf16 with torch ops, then a bf16 fused MoE runs (the Triton one
    of triton_emulation, weights unquantized; activations still quantized as the scheme says)."""

    name = "dequantize_all"
    operand_dtype = torch.bfloat16
    numerical_structure = "rounded_terms"  # triton_emulation's kernels do the rest

    def __init__(self, device: str | None = None):
        from harness.backends.triton_emulation import TritonEmulationBackend

        self.inner = TritonEmulationBackend(device)
        self.device = self.inner.device

    def supports(self, problem, platform):
        return (problem.scheme.weight is not None, "quantized weights only (bf16 has nothing to dequantize)")

    def prepare(self, ckpt: MoECheckpoint):
        import dataclasses

        from reference.formats import E2M1, E4M3FN as _E4M3FN

        dev = self.device
        weightless = dataclasses.replace(ckpt, scheme=dataclasses.replace(ckpt.scheme, weight=None))
        wq = ckpt.scheme.weight
        elem = wq.kind.code_format(wq, ckpt.fp8_format)
        luts = dict(code=elem.values_fp32.to(dev), e4m3=_E4M3FN.values_fp32.to(dev), e2m1=E2M1.values_fp32.to(dev))
        weights = {n: QuantizedWeight(getattr(ckpt, n).data.to(dev),
                                      None if getattr(ckpt, n).scale is None else getattr(ckpt, n).scale.to(dev),
                                      None if getattr(ckpt, n).global_scale is None else getattr(ckpt, n).global_scale.to(dev))
                   for n in ("w13", "w2")}
        return dict(inner=self.inner.prepare(weightless), ckpt=ckpt, luts=luts, weights=weights)

    EXPERTS_PER_CHUNK = 16  # bounds the fp32 temporaries (Kimi-K2: 384 experts, 11G weights)

    @classmethod
    def _dequantize(cls, w: QuantizedWeight, ckpt: MoECheckpoint, luts) -> torch.Tensor:
        wq = ckpt.scheme.weight
        e = w.data.shape[0]
        k = w.data.shape[2] * (2 if wq.kind.code_format(wq, ckpt.fp8_format).nbits == 4 else 1)
        out = torch.empty(e, w.data.shape[1], k, dtype=torch.bfloat16, device=w.data.device)
        for e0 in range(0, e, cls.EXPERTS_PER_CHUNK):
            sl = slice(e0, e0 + cls.EXPERTS_PER_CHUNK)
            out[sl] = cls._dequantize_experts(w, sl, ckpt, luts)
        return out

    @staticmethod
    def _dequantize_experts(w: QuantizedWeight, sl: slice, ckpt: MoECheckpoint, luts) -> torch.Tensor:
        from reference.checkpoints import nvfp4_decode_scale

        wq = ckpt.scheme.weight
        codes = w.data[sl]
        if wq.kind.code_format(wq, ckpt.fp8_format).nbits == 4:
            codes = torch.stack((codes & 0xF, codes >> 4), dim=-1).flatten(-2)
        v = luts["code"][codes.int()]
        e, n, k = v.shape
        if wq.kind is MX:
            s = torch.exp2(w.scale[sl].float() - 127)
            v = (v.view(e, n, k // 32, 32) * s[..., None]).view(e, n, k)
        elif wq.kind is NVFP4:
            s_dec = nvfp4_decode_scale(w.global_scale[sl], ckpt.nvfp4_global_convention)
            # the reference's order: code value x block scale, then x the global decode scale
            v = (v.view(e, n, k // 16, 16) * luts["e4m3"][w.scale[sl].int()][..., None]
                 * s_dec[:, None, None, None]).view(e, n, k)
        elif w.scale[sl].numel() == e:  # per-tensor FP8: one scale per expert, any shape
            v = v * w.scale[sl].reshape(e, 1, 1)
        else:  # FP8 128x128 blocks
            v = v * w.scale[sl].repeat_interleave(128, 1).repeat_interleave(128, 2)
        return v.to(torch.bfloat16)

    def launch(self, prep, x, topk_weights, topk_ids):
        import dataclasses

        ckpt, luts = prep["ckpt"], prep["luts"]
        inner = dataclasses.replace(prep["inner"], w13=self._dequantize(prep["weights"]["w13"], ckpt, luts),
                                    w2=self._dequantize(prep["weights"]["w2"], ckpt, luts))
        return self.inner.launch(inner, x, topk_weights, topk_ids)

    def forward(self, prep, hidden_states, topk_weights, topk_ids):
        from reference.moe import check_moe_inputs

        check_moe_inputs(hidden_states.cpu(), prep["ckpt"], topk_weights.cpu(), topk_ids.cpu())
        dev = self.device
        return self.launch(prep, hidden_states.to(dev).contiguous(), topk_weights.to(dev).float().contiguous(),
                           topk_ids.to(dev).contiguous())


# ---- the report: table and roofline ------------------------------------------------------------------


def write_bench_report(rows: list[dict], anchors: dict, out_dir) -> dict:
    """bench/results.json, bench/table.md and bench/roofline.png from the benchmark rows."""
    import json
    from pathlib import Path

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(dict(anchors=anchors, rows=rows), indent=1))
    lines = [f"Copy bandwidth {anchors.get('copy_tb_s', 0):.2f} TB/s, bf16 dense matmul "
             f"{anchors.get('dense_bf16_tflops', 0):.0f} TFLOP/s (measured in this run); {anchors.get('device', '')}", "",
             "| model | scheme | tokens | backend | median us | TB/s | % copy | TFLOP/s | % dense |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["model"], r["scheme"], r["tokens"], r["backend"])):
        lines.append(f"| {r['model']} | {r['scheme']} | {r['tokens']} | {r['backend']} | {r['us']:.1f} | "
                     f"{r['tb_s']:.2f} | {r['pct_copy']:.1f} | {r['tflops']:.1f} | {r['pct_dense']:.1f} |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    paths = dict(json=out / "results.json", table=out / "table.md", targets=out / "targets.md")
    targets = evaluate_targets(rows, anchors)
    paths["targets"].write_text(format_targets(targets))
    if rows and anchors.get("copy_tb_s"):
        paths["roofline"] = _roofline(rows, anchors, out / "roofline.png")
    return paths


def _series(row: dict) -> str:
    """The plot's series: the backend, with the unquantized baseline apart from the quantized runs."""
    return f"bf16 unquantized ({row['backend']})" if row["scheme"] == "bf16" else row["backend"]


def _roofline(rows: list[dict], anchors: dict, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bw, peak = anchors["copy_tb_s"] * 1e12, anchors["dense_bf16_tflops"] * 1e12
    fig, ax = plt.subplots(figsize=(9, 6), dpi=110)
    xs = [r["flops"] / r["bytes"] for r in rows]
    lo, hi = min(xs) / 2, max(xs) * 2
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(grid, [min(bw * x, peak) / 1e12 for x in grid], "k-", linewidth=1, label="roofline (measured copy BW, bf16 dense)")
    markers = dict(zip(sorted({r["model"] for r in rows}), "osD^v"))
    colours = {b: f"C{i}" for i, b in enumerate(sorted({_series(r) for r in rows}))}
    for r in rows:
        ax.scatter(r["flops"] / r["bytes"], r["tflops"], marker=markers[r["model"]], color=colours[_series(r)], s=22)
    for b, c in colours.items():
        ax.scatter([], [], color=c, label=b)
    for m, mk in markers.items():
        ax.scatter([], [], marker=mk, color="grey", label=m)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per byte of activated weights + activations)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(f"MoE forward on {anchors.get('device', 'GPU')}: every backend, shape, scheme and token count", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def anchors() -> dict:
    """The run's reference points (measured now, on this GPU)."""
    if not has_gpu():
        return {}
    return dict(device=torch.cuda.get_device_name(0), torch=torch.__version__,
                copy_tb_s=copy_bandwidth() / 1e12, dense_bf16_tflops=dense_bf16_tflops())


# ---- issue-8 targets, evaluated from one run's rows ---------------------------------------------------

DECODE_TOKENS = (8, 64)


def _best(rows, model, scheme, tokens, exclude=("dequantize_all",)):
    cands = [r for r in rows if r["model"] == model and r["scheme"] == scheme and r["tokens"] == tokens
             and r["backend"] not in exclude]
    return min(cands, key=lambda r: r["us"]) if cands else None


def evaluate_targets(rows: list[dict], anchors: dict) -> list[dict]:
    """Each target as (what, case, measured, goal, met), from rows of one run (the fastest kernel backend
    of each case; dequantize_all is the baseline, never the candidate)."""
    out = []

    def add(target, case, value, goal, met, unit=""):
        out.append(dict(target=target, case=case, value=value, goal=goal, met=bool(met), unit=unit))

    for model in ("gpt-oss-120b", "kimi-k2"):
        for t in (1, *DECODE_TOKENS):
            b = _best(rows, model, "w_mxfp4", t)
            if b:
                # 1 token is reported, not judged (the target is 8-64 tokens)
                add("MXFP4 W4A16 decode: % of copy bandwidth" + (" (reported)" if t == 1 else ""),
                    f"{model} T={t} ({b['backend']})", b["pct_copy"], 70, b["pct_copy"] >= 70, "%")
    for model in sorted({r["model"] for r in rows}):
        for t in DECODE_TOKENS:
            for scheme in ("w_mxfp4", "w_nvfp4"):
                b = _best(rows, model, scheme, t)
                deq = [r for r in rows if r["model"] == model and r["scheme"] == scheme and r["tokens"] == t
                       and r["backend"] == "dequantize_all"]
                if b and deq:
                    x = deq[0]["us"] / b["us"]
                    add("decode: x faster than dequantize-all", f"{model} {scheme} T={t} ({b['backend']})", x, 10, x >= 10, "x")
                bf = _best(rows, model, "bf16", t)
                if b and bf:
                    x = bf["us"] / b["us"]
                    add("decode: x faster than bf16 unquantized", f"{model} {scheme} T={t} ({b['backend']})", x, 2.5,
                        x >= 2.5, "x")
        for scheme in ("w_mxfp4", "w_nvfp4", "w_nvfp4_a_nvfp4", "bf16"):
            b = _best(rows, model, scheme, 8192)
            if b:
                add("prefill T=8192: % of dense bf16 matmul", f"{model} {scheme} ({b['backend']})", b["pct_dense"], 60,
                    b["pct_dense"] >= 60, "%")
        for t in (1, *DECODE_TOKENS):
            mx = _best(rows, model, "w_mxfp4", t)
            for scheme in ("w_nvfp4", "w_nvfp4_a_nvfp4"):
                nv = _best(rows, model, scheme, t)
                if mx and nv:
                    x = nv["us"] / mx["us"]
                    add("NVFP4 time / MXFP4 W4A16 time", f"{model} {scheme} T={t} ({nv['backend']} vs {mx['backend']})",
                        x, 1.15, x <= 1.15, "x")
    return out


def format_targets(targets: list[dict]) -> str:
    lines = ["| target | case | measured | goal | met |", "|---|---|---|---|---|"]
    for t in targets:
        goal = f"<= {t['goal']}" if t["target"].startswith("NVFP4") else f">= {t['goal']}"
        lines.append(f"| {t['target']} | {t['case']} | {t['value']:.3g}{t['unit']} | {goal}{t['unit']} | "
                     f"{'yes' if t['met'] else '**no**'} |")
    return "\n".join(lines) + "\n"
