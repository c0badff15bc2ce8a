"""What the benchmarks run: the model shapes users serve, token counts, checkpoints of those shapes built
on the device, routed inputs, and the bytes and FLOPs a MoE forward must move and do."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reference.activations import activation_by_name
from reference.checkpoints import MoECheckpoint, QuantizedWeight
from reference.formats import E4M3FN
from reference.routing import RoutingConfig, route
from reference.schemes import scheme_by_name

__all__ = ["ModelShape", "MODEL_SHAPES", "TOKENS", "CPU_SHAPE", "device_checkpoint", "weight_bytes", "moe_flops", "model_case_parser",
           "io_bytes", "routed_inputs", "roofline_time_s"]


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
    tokens: tuple[int, ...] | None = None  # the token counts benchmarked (None: TOKENS)


MODEL_SHAPES = {
    s.name: s
    for s in (
        ModelShape("gpt-oss-120b", 128, 4, 2880, 2880, "SWIGLUOAI", ("w_mxfp4", "w_nvfp4", "w_nvfp4_a_nvfp4", "bf16"),
                   biased=True),
        # NVFP4 W4A4 too: issue 28's "within 1.15x of MXFP4 at every decode point" is measured on both models
        ModelShape("kimi-k2", 384, 8, 7168, 2048, "SILU",
                   ("w_mxfp4", "w_nvfp4", "w_nvfp4_a_nvfp4", "bf16", "w_fp8_a_fp8")),
        ModelShape("qwen3-30b-a3b", 128, 8, 2048, 768, "SILU", ("w_nvfp4", "w_mxfp4", "bf16")),
        # Kimi-K2's experts with gpt-oss's activation, the only one vLLM's triton_kernels path fuses (SWIGLUOAI):
        # the anchor's Kimi-K2-shaped row (issue 28: "faster than triton_kernels on gpt-oss-120b and Kimi-K2").
        # The same weight bytes as Kimi-K2's SILU; the activation is in GEMM1's epilogue.
        ModelShape("kimi-k2-swigluoai", 384, 8, 7168, 2048, "SWIGLUOAI", ("w_mxfp4",), tokens=(1, 8, 64)),
    )
}
TOKENS = (1, 8, 64, 512, 8192)
# On a CPU the benchmark tests run once, as correctness checks, at this shape (the interpreter is slow)
CPU_SHAPE = ModelShape("cpu-check", 8, 2, 128, 128, "SILU", ())


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


def model_case_parser(doc: str, tokens: int = 8192):
    """The command line of a script that looks at one registered backend at a model's full shape (the run scripts
    under results/): --model, --scheme, --backend, --tokens."""
    import argparse

    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--model", required=True, choices=sorted(MODEL_SHAPES))
    ap.add_argument("--scheme", required=True)
    ap.add_argument("--backend", required=True)
    ap.add_argument("--tokens", type=int, default=tokens)
    return ap


def model_launch(shape: ModelShape, scheme_name: str, backend_name: str, tokens: int, device="cuda"):
    """(backend, launch): a registered backend's forward at the model's full shape as make bench times it (its
    launch() on device_checkpoint and routed_inputs, fp32 top-k weights), for the tools that look inside one
    (tools/chain_timeline.py, tools/ncu_moe.py)."""
    from harness.backends import load_backend

    backend = load_backend(backend_name)
    prep = backend.prepare(device_checkpoint(shape, scheme_name, device))
    x, w, ids = routed_inputs(shape, tokens, device)
    w = w.float().contiguous()
    return backend, lambda: backend.launch(prep, x, w, ids)


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
