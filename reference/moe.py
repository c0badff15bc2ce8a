"""The reference fused MoE: the value a checkpoint means, with a kernel's rounding points.

For each token t and each of its top-k experts e (weight w):
  a1 = Qa(x_t)                        activation quantization of the GEMM1 input (none for A16 schemes)
  h  = W13_e a1 + b13_e               -> bf16 if rounding.gemm1_out
  y  = act(h)   (fp32)                -> bf16 if rounding.act_out
  a2 = Qa(y)                          activation quantization of the GEMM2 input (none for A16 schemes)
  z  = W2_e a2 + b2_e                 -> bf16 if rounding.gemm2_out
  out_t = sum_k w * z                 -> bf16 if rounding.output
GEMMs accumulate in float64 here (the exact sum, up to 1e-16), weights are the checkpoint's dequantized
values (reference.checkpoints.dequantize_weight). Static activation scales are the max over experts of
the checkpoint's input scales (NVFP4: one a1 and one a2 global scale shared by all experts).
`exact=True` drops every bf16 rounding point and computes the activation in float64: the mathematical
meaning (activation quantizers then see the fp32 rounding of their float64 input).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .activations import apply_activation
from .checkpoints import MoECheckpoint, dequantize_weight, nvfp4_decode_scale
from .fp8 import qdq_fp8
from .mx import qdq_mx
from .nvfp4 import qdq_nvfp4
from .schemes import ActQuant

__all__ = ["MoETrace", "fused_moe", "round_bf16", "activation_qdq", "static_activation_scales", "check_moe_inputs"]


@dataclass
class MoETrace:
    """Every intermediate of one reference forward, per (token, k) pair in row-major order."""

    a1: torch.Tensor  # [T, H] float64, GEMM1 input after activation quantization
    h: torch.Tensor  # [P, N13] float64, after the gemm1_out rounding point
    y: torch.Tensor  # [P, I] float64, after the act_out rounding point
    a2: torch.Tensor  # [P, I] float64, GEMM2 input after activation quantization
    z: torch.Tensor  # [P, H] float64, after the gemm2_out rounding point
    out: torch.Tensor  # [T, H] float64, after the output rounding point
    h_pre: torch.Tensor  # the same four before their rounding points
    y_pre: torch.Tensor
    z_pre: torch.Tensor
    out_pre: torch.Tensor
    w13: torch.Tensor  # [E, N13, H] float64 dequantized weights
    w2: torch.Tensor  # [E, H, I]
    pair_token: torch.Tensor  # [P] token of each pair
    pair_expert: torch.Tensor  # [P] expert of each pair
    pair_weight: torch.Tensor  # [P] routing weight of each pair (float64)
    a1_scale: torch.Tensor | None  # static a1 scale actually used (FP8 scale / NVFP4 decode global)
    a2_scale: torch.Tensor | None
    top_k: int


def round_bf16(x: torch.Tensor, enabled: bool = True) -> torch.Tensor:
    """float64 -> bf16 the way a kernel rounds: to fp32 (its accumulator), then to bf16, both RNE."""
    return x.float().to(torch.bfloat16).double() if enabled else x


def static_activation_scales(ckpt: MoECheckpoint) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(a1, a2) static scales: the max over experts of the checkpoint's input scales, in the
    multiply-on-dequant direction. None for dynamic and A16 schemes."""
    aq = ckpt.scheme.act
    if aq is None or not aq.static:
        return None, None
    if ckpt.w13_input_scale is None or ckpt.w2_input_scale is None:
        raise ValueError(
            f"scheme {ckpt.scheme.name} quantizes activations with static scales, but the checkpoint has no "
            "w13_input_scale/w2_input_scale (a weight-only checkpoint run as W4A4?)"
        )
    scales = []
    for s in (ckpt.w13_input_scale, ckpt.w2_input_scale):
        if aq.kind == "nvfp4":
            s = nvfp4_decode_scale(s, ckpt.nvfp4_global_convention)
        if not bool(torch.isfinite(s).all()) or not bool((s > 0).all()):
            raise ValueError(f"input scales must be positive and finite, got {s.tolist()}")
        scales.append(s.float().amax())
    return scales[0], scales[1]


def activation_qdq(x: torch.Tensor, aq: ActQuant | None, ckpt: MoECheckpoint, static_scale) -> torch.Tensor:
    """Quantize-dequantize GEMM-input activations [rows, K] along K as the scheme says (fp32 in, fp32 out)."""
    if aq is None:
        return x
    if aq.kind == "mx":
        return qdq_mx(x, aq.elem)
    if aq.kind == "nvfp4":
        return qdq_nvfp4(x, global_decode_scale=static_scale)
    fmt = ckpt.fp8_format
    if aq.static:
        return qdq_fp8(x, fmt, scale=static_scale)
    return qdq_fp8(x, fmt, granularity=aq.granularity, block_shape=aq.block_shape)


def check_moe_inputs(hidden_states, ckpt: MoECheckpoint, topk_weights, topk_ids) -> None:
    """The argument checks every MoE entry point shares (reference and backends)."""
    if not isinstance(hidden_states, torch.Tensor) or hidden_states.dtype != torch.bfloat16:
        raise TypeError(f"hidden_states must be a bfloat16 tensor, got {getattr(hidden_states, 'dtype', type(hidden_states))}")
    if hidden_states.dim() != 2 or hidden_states.shape[1] != ckpt.hidden_size:
        raise ValueError(f"hidden_states must be [tokens, {ckpt.hidden_size}], got {tuple(hidden_states.shape)}")
    t = hidden_states.shape[0]
    if not isinstance(topk_ids, torch.Tensor) or topk_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"topk_ids must be an int32/int64 tensor, got {getattr(topk_ids, 'dtype', type(topk_ids))}")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != t:
        raise ValueError(f"topk_ids must be [tokens={t}, top_k], got {tuple(topk_ids.shape)}")
    if not 1 <= topk_ids.shape[1] <= ckpt.num_experts:
        raise ValueError(f"top_k must be in [1, num_experts={ckpt.num_experts}], got {topk_ids.shape[1]}")
    if topk_ids.numel() and (int(topk_ids.min()) < 0 or int(topk_ids.max()) >= ckpt.num_experts):
        raise ValueError(
            f"topk_ids must lie in [0, {ckpt.num_experts}), got values in [{int(topk_ids.min())}, {int(topk_ids.max())}]"
        )
    if not isinstance(topk_weights, torch.Tensor) or topk_weights.dtype != torch.float32:
        raise TypeError(f"topk_weights must be a float32 tensor, got {getattr(topk_weights, 'dtype', type(topk_weights))}")
    if tuple(topk_weights.shape) != tuple(topk_ids.shape):
        raise ValueError(f"topk_weights must have topk_ids' shape {tuple(topk_ids.shape)}, got {tuple(topk_weights.shape)}")
    if not bool(torch.isfinite(hidden_states).all()):
        raise ValueError("hidden_states must be finite (NaN/Inf found)")
    if not bool(torch.isfinite(topk_weights).all()):
        raise ValueError("topk_weights must be finite")


def fused_moe(
    hidden_states: torch.Tensor,
    ckpt: MoECheckpoint,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    exact: bool = False,
    trace: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, MoETrace]:
    """The reference MoE forward: bf16 [T, H] (float64 if exact) and optionally the trace."""
    check_moe_inputs(hidden_states, ckpt, topk_weights, topk_ids)
    scheme, act, aq = ckpt.scheme, ckpt.activation, ckpt.scheme.act
    rnd = scheme.rounding
    keep = lambda name: (not exact) and getattr(rnd, name)  # noqa: E731
    t, hsz = hidden_states.shape
    k = topk_ids.shape[1]
    w13 = dequantize_weight(ckpt.w13, scheme.weight, ckpt).double()
    w2 = dequantize_weight(ckpt.w2, scheme.weight, ckpt).double()
    a1_scale, a2_scale = static_activation_scales(ckpt)

    a1 = activation_qdq(hidden_states.float(), aq, ckpt, a1_scale).double()
    pair_token = torch.arange(t).repeat_interleave(k)
    pair_expert = topk_ids.reshape(-1).long()
    pair_weight = topk_weights.reshape(-1).double()
    p = t * k
    n13 = w13.shape[1]
    isz = ckpt.intermediate_size
    h = torch.zeros(p, n13, dtype=torch.float64)
    z = torch.zeros(p, hsz, dtype=torch.float64)
    y = torch.zeros(p, isz, dtype=torch.float64)
    a2 = torch.zeros(p, isz, dtype=torch.float64)
    h_pre, y_pre, z_pre = torch.zeros_like(h), torch.zeros_like(y), torch.zeros_like(z)
    for e in pair_expert.unique().tolist():
        rows = (pair_expert == e).nonzero().flatten()
        he = a1[pair_token[rows]] @ w13[e].T
        if ckpt.b13 is not None:
            he = he + ckpt.b13[e].double()
        h_pre[rows] = he
        he = round_bf16(he, keep("gemm1_out"))
        ye = apply_activation(he if exact else he.float(), act).double()
        y_pre[rows] = ye
        ye = round_bf16(ye, keep("act_out"))
        a2e = activation_qdq(ye.float(), aq, ckpt, a2_scale).double() if aq is not None else ye
        ze = a2e @ w2[e].T
        if ckpt.b2 is not None:
            ze = ze + ckpt.b2[e].double()
        z_pre[rows] = ze
        h[rows], y[rows], a2[rows], z[rows] = he, ye, a2e, round_bf16(ze, keep("gemm2_out"))
    out_pre = (z * pair_weight[:, None]).reshape(t, k, hsz).sum(1)
    out = round_bf16(out_pre, keep("output"))
    result = out if exact else out.to(torch.bfloat16)
    if not trace:
        return result
    return result, MoETrace(
        a1, h, y, a2, z, out, h_pre, y_pre, z_pre, out_pre, w13, w2, pair_token, pair_expert, pair_weight,
        a1_scale, a2_scale, k,
    )
