"""MoE checkpoints in checkpoint layout, and builders of realistic dummy ones.

Layout (per expert e; K is the input dim, quantized along it):
  w13  [E, N13, H]  N13 = 2I for gated activations (gate rows then up rows, or interleaved gate/up rows
                    for SWIGLUOAI, as gpt-oss stores them), I for *_NO_MUL
  w2   [E, H, I]
  codes: FP4 packed two per byte along K ([E, N, K/2], element 2j in the low nibble); FP6 and FP8 one
  code per byte ([E, N, K]; FP6 bit-packing is a backend layout); bf16 weights as bf16.
  scales: MX E8M0 [E, N, K/32]; NVFP4 E4M3 [E, N, K/16] plus one fp32 global scale per expert [E];
  FP8 fp32 [E, 1, 1] (per-tensor) or [E, N/128, K/128].
NVFP4 global scales come in two conventions (a wrong multiply/divide by them is a real bug):
  "decode"  ModelOpt: weight_scale_2 = amax / 2688, input_scale = amax / 2688 (dequant multiplies)
  "encode"  compressed-tensors: weight_global_scale = 2688 / amax, input_global_scale likewise
Activation input scales (static schemes only) are per expert [E]; the MoE uses the max over experts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .activations import Activation, activation_by_name, apply_activation
from .formats import E4M3FN, E4M3FNUZ, FloatFormat
from .fp8 import dequantize_fp8, quantize_fp8
from .mx import dequantize_mx, quantize_mx
from .nvfp4 import dequantize_nvfp4, nvfp4_global_encode_scale, quantize_nvfp4
from .packing import pack_fp4, unpack_fp4
from .schemes import Scheme, WeightQuant, scheme_by_name

__all__ = [
    "QuantizedWeight", "MoECheckpoint", "make_checkpoint", "dequantize_weight", "nvfp4_decode_scale", "NVFP4_CONVENTIONS",
]

NVFP4_CONVENTIONS = ("decode", "encode")
_NVFP4_AMAX_DIVISOR = 448.0 * 6.0


@dataclass(frozen=True)
class QuantizedWeight:
    data: torch.Tensor  # bf16 values, or uint8 codes (FP4 packed)
    scale: torch.Tensor | None = None  # MX/NVFP4 uint8 block scales; FP8 fp32 scales
    global_scale: torch.Tensor | None = None  # NVFP4 [E] fp32, direction per the checkpoint's convention


@dataclass(frozen=True)
class MoECheckpoint:
    scheme: Scheme
    activation: Activation
    w13: QuantizedWeight
    w2: QuantizedWeight
    hidden_size: int
    intermediate_size: int
    b13: torch.Tensor | None = None  # fp32 [E, N13]
    b2: torch.Tensor | None = None  # fp32 [E, H]
    w13_input_scale: torch.Tensor | None = None  # fp32 [E]: the a1 scale (FP8 per-tensor; NVFP4 global)
    w2_input_scale: torch.Tensor | None = None  # fp32 [E]: the a2 scale
    nvfp4_global_convention: str = "decode"
    fp8_format: FloatFormat = E4M3FN

    @property
    def num_experts(self) -> int:
        return self.w13.data.shape[0]

    def with_weight(self, name: str, weight: QuantizedWeight) -> "MoECheckpoint":
        return replace(self, **{name: weight})


def nvfp4_decode_scale(global_scale: torch.Tensor, convention: str) -> torch.Tensor:
    """The multiply-on-dequant direction, from a checkpoint's stored global scale."""
    if convention == "decode":
        return global_scale
    if convention == "encode":
        return 1.0 / global_scale
    raise ValueError(f"nvfp4_global_convention must be one of {NVFP4_CONVENTIONS}, got {convention!r}")


def dequantize_weight(w: QuantizedWeight, wq: WeightQuant | None, ckpt: MoECheckpoint) -> torch.Tensor:
    """The fp32 values a checkpoint weight means, [E, N, K]."""
    if wq is None:
        return w.data.float()
    if wq.kind == "mx":
        codes = unpack_fp4(w.data) if wq.elem.nbits == 4 else w.data
        return dequantize_mx(codes, w.scale, wq.elem)
    if wq.kind == "nvfp4":
        s_dec = nvfp4_decode_scale(w.global_scale, ckpt.nvfp4_global_convention)
        return dequantize_nvfp4(unpack_fp4(w.data), w.scale, s_dec[:, None, None])
    return dequantize_fp8(w.data, w.scale, ckpt.fp8_format)


def _quantize_weight(w: torch.Tensor, wq: WeightQuant | None, convention: str, fp8_format: FloatFormat) -> QuantizedWeight:
    if wq is None:
        return QuantizedWeight(w.to(torch.bfloat16))
    if wq.kind == "mx":
        q = quantize_mx(w, wq.elem, scale_mode=wq.scale_mode)
        data = pack_fp4(q.codes) if wq.elem.nbits == 4 else q.codes
        return QuantizedWeight(data, q.scales)
    if wq.kind == "nvfp4":
        amax = w.abs().amax(dim=(1, 2))
        s_enc = nvfp4_global_encode_scale(amax)
        q = quantize_nvfp4(w, global_encode_scale=s_enc[:, None, None])
        stored = q.global_decode_scale.reshape(-1) if convention == "decode" else s_enc
        return QuantizedWeight(pack_fp4(q.codes), q.block_scales, stored.float())
    q = quantize_fp8(w, fp8_format, granularity=wq.granularity, block_shape=wq.block_shape)
    return QuantizedWeight(q.codes, q.scale)


def _dummy_weight(g: torch.Generator, e: int, n: int, k: int, outliers: int, outlier_scale: float) -> torch.Tensor:
    """Gaussian weights scaled by 1/sqrt(k), with a few input channels per expert `outlier_scale` times
    larger (the outlier channels that make per-block scales matter), rounded to bf16 as a checkpoint is."""
    w = torch.randn(e, n, k, generator=g) / k**0.5
    for i in range(e):
        cols = torch.randperm(k, generator=g)[:outliers]
        w[i, :, cols] *= outlier_scale
    return w.to(torch.bfloat16).float()


def make_checkpoint(
    scheme: Scheme | str,
    activation: Activation | str,
    num_experts: int,
    hidden_size: int,
    intermediate_size: int,
    *,
    seed: int = 0,
    with_bias: bool = False,
    nvfp4_global_convention: str = "decode",
    fp8_format: FloatFormat = E4M3FN,
    outlier_channels: int = 2,
    outlier_scale: float = 16.0,
    calibration_tokens: int = 32,
    bias_scale: float = 1.0,
) -> MoECheckpoint:
    """A quantized MoE checkpoint from random bf16 weights with outlier channels.

    Static activation scales (FP8 per-tensor, NVFP4 globals) are calibrated on random bf16 tokens:
    per expert, from the amax that expert's input sees, jittered per expert so that "max over experts"
    differs from any single expert's. Weight-only schemes get no input scales at all."""
    scheme = scheme_by_name(scheme)
    activation = activation_by_name(activation) if isinstance(activation, str) else activation
    if nvfp4_global_convention not in NVFP4_CONVENTIONS:
        raise ValueError(f"nvfp4_global_convention must be one of {NVFP4_CONVENTIONS}, got {nvfp4_global_convention!r}")
    if fp8_format not in (E4M3FN, E4M3FNUZ):
        raise ValueError(f"fp8_format must be E4M3FN or E4M3FNUZ, got {fp8_format!r}")
    for name, n, mult in (
        ("hidden_size", hidden_size, scheme.k_multiple()),
        ("intermediate_size", intermediate_size, max(scheme.k_multiple(), scheme.n_multiple())),
    ):
        if n <= 0 or n % mult:
            raise ValueError(f"{name}={n} must be a positive multiple of {mult} for scheme {scheme.name}")
    if hidden_size % scheme.n_multiple():
        raise ValueError(f"hidden_size={hidden_size} must be a multiple of {scheme.n_multiple()} for {scheme.name}")
    if num_experts <= 0:
        raise ValueError(f"num_experts must be positive, got {num_experts}")
    g = torch.Generator().manual_seed(seed)
    n13 = 2 * intermediate_size if activation.gated else intermediate_size
    w13 = _dummy_weight(g, num_experts, n13, hidden_size, outlier_channels, outlier_scale)
    w2 = _dummy_weight(g, num_experts, hidden_size, intermediate_size, outlier_channels, outlier_scale)
    # biases on the scale of the GEMM outputs they join (gpt-oss's are not small next to them): a bias
    # applied in the wrong place moves most outputs, not a few
    b13 = torch.randn(num_experts, n13, generator=g) * bias_scale if with_bias else None
    b2 = torch.randn(num_experts, hidden_size, generator=g) * bias_scale if with_bias else None
    ckpt = MoECheckpoint(
        scheme=scheme,
        activation=activation,
        w13=_quantize_weight(w13, scheme.weight, nvfp4_global_convention, fp8_format),
        w2=_quantize_weight(w2, scheme.weight, nvfp4_global_convention, fp8_format),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        b13=b13,
        b2=b2,
        nvfp4_global_convention=nvfp4_global_convention,
        fp8_format=fp8_format,
    )
    if not scheme.needs_input_scales:
        return ckpt
    x_cal = torch.randn(calibration_tokens, hidden_size, generator=g).to(torch.bfloat16).float()
    jitter = 0.75 + 0.5 * torch.rand(num_experts, generator=g)
    a1_amax = x_cal.abs().amax() * jitter
    w13_deq = dequantize_weight(ckpt.w13, scheme.weight, ckpt)
    h = torch.einsum("th,enh->etn", x_cal, w13_deq)
    if b13 is not None:
        h = h + b13[:, None, :]
    a2_amax = apply_activation(h, activation).abs().amax(dim=(1, 2)) * jitter.flip(0)
    return replace(
        ckpt,
        w13_input_scale=_input_scale(a1_amax, scheme, nvfp4_global_convention, fp8_format),
        w2_input_scale=_input_scale(a2_amax, scheme, nvfp4_global_convention, fp8_format),
    )


def _input_scale(amax: torch.Tensor, scheme: Scheme, convention: str, fp8_format: FloatFormat) -> torch.Tensor:
    if scheme.act.kind == "fp8":
        return (amax / fp8_format.max_normal).float()
    decode_dir = (amax / _NVFP4_AMAX_DIVISOR).float()
    return decode_dir if convention == "decode" else nvfp4_global_encode_scale(amax)

