"""FP8 quantize-dequantize (QDQ): per-tensor, per-token and per-block scales, static or dynamic.

Scales live over the last two dims of x ([..., M, K]); leading dims are a batch (an MoE weight
[E, N, K] gets one scale per expert under PER_TENSOR, as checkpoints store them):
  PER_TENSOR  scale [..., 1, 1]
  PER_TOKEN   scale [..., M, 1]                (one per row)
  PER_BLOCK   scale [..., M/bm, K/bk]          (1x128 for activations, 128x128 for weights)
Dynamic scale = max(fl(amax / max_value), 1 / (max_value * 512)): the lower guard keeps an all-zero
group from dividing by zero (vLLM's MIN_SCALING_FACTOR). Quantized code = RNE(clamp(fl(x / scale),
+-max_value)); dequantized value = fl(decode(code) * scale).
Named variants: max_value=224 for E4M3FNUZ (vLLM clamps there in places; default is the format's max,
240); ScaleApply.RECIPROCAL_MULTIPLY computes x * fl(1/scale) as several kernels do, instead of x / scale.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

import torch

from .formats import E4M3FN, E4M3FNUZ, E5M2, FloatFormat, Overflow, check_codes, check_float_input, check_int, decode
from .formats import check_output_dtype, encode_finite, true_divide

__all__ = [
    "FP8_FORMATS",
    "Granularity",
    "ScaleApply",
    "FP8Quantized",
    "fp8_group_shape",
    "fp8_dynamic_scale",
    "quantize_fp8",
    "dequantize_fp8",
    "qdq_fp8",
]

FP8_FORMATS: tuple[FloatFormat, ...] = (E4M3FN, E4M3FNUZ, E5M2)
_MIN_SCALE_DIVISOR = 512.0


class Granularity(enum.Enum):
    PER_TENSOR = "per_tensor"
    PER_TOKEN = "per_token"
    PER_BLOCK = "per_block"


class ScaleApply(enum.Enum):
    DIVIDE = "divide"  # fl(x / scale)
    RECIPROCAL_MULTIPLY = "reciprocal_multiply"  # fl(x * fl(1 / scale))


class FP8Quantized(NamedTuple):
    codes: torch.Tensor  # uint8 FP8 codes, x's shape
    scale: torch.Tensor  # fp32, [..., M/bm, K/bk]


def fp8_group_shape(shape, granularity: Granularity, block_shape: tuple[int, int] | None) -> tuple[int, int]:
    """(bm, bk): the rows and columns of x's last two dims that share one scale."""
    if len(shape) < 2:
        raise ValueError(f"x must have at least 2 dims [..., M, K] for FP8 scales, got shape {tuple(shape)}")
    m, k = shape[-2], shape[-1]
    if granularity is Granularity.PER_TENSOR:
        return (max(m, 1), k)
    if granularity is Granularity.PER_TOKEN:
        return (1, k)
    if granularity is Granularity.PER_BLOCK:
        if not isinstance(block_shape, (tuple, list)) or len(block_shape) != 2:
            raise ValueError(f"PER_BLOCK needs block_shape=(bm, bk) of positive ints, got {block_shape!r}")
        for i, b in enumerate(block_shape):
            check_int(b, f"block_shape[{i}]", 1)
        bm, bk = block_shape
        if m % bm or k % bk:
            raise ValueError(f"x's last two dims {(m, k)} are not divisible by block_shape {tuple(block_shape)}")
        return (bm, bk)
    raise TypeError(f"granularity must be a Granularity, got {granularity!r}")


def _scale_shape(shape, granularity: Granularity, bm: int, bk: int) -> tuple[int, ...]:
    rows = 1 if granularity is Granularity.PER_TENSOR else shape[-2] // bm  # zero rows keep a tensor scale
    return (*shape[:-2], rows, shape[-1] // bk)


def _groups(x: torch.Tensor, bm: int, bk: int) -> torch.Tensor:
    """[..., M, K] -> [..., M/bm, K/bk, bm, bk] (a copy where needed, never a write to x)."""
    *lead, m, k = x.shape
    return x.reshape(*lead, m // bm, bm, k // bk, bk).transpose(-3, -2)


def _ungroup(g: torch.Tensor, shape) -> torch.Tensor:
    return g.transpose(-3, -2).reshape(shape)


def _check_fmt(fmt: FloatFormat, max_value: float | None) -> float:
    if fmt not in FP8_FORMATS:
        raise ValueError(f"fmt must be one of {[f.name for f in FP8_FORMATS]}, got {fmt!r}")
    if max_value is None:
        return fmt.max_normal
    if not 0 < max_value <= fmt.max_normal:
        raise ValueError(f"max_value must be in (0, {fmt.max_normal}] for {fmt.name}, got {max_value}")
    return float(max_value)


def fp8_dynamic_scale(
    x: torch.Tensor,
    fmt: FloatFormat,
    granularity: Granularity = Granularity.PER_TENSOR,
    block_shape: tuple[int, int] | None = None,
    max_value: float | None = None,
) -> torch.Tensor:
    """max(fl(amax / max_value), 1 / (max_value * 512)) per group, fp32 [..., M/bm, K/bk]."""
    check_float_input(x)
    fmax = _check_fmt(fmt, max_value)
    bm, bk = fp8_group_shape(x.shape, granularity, block_shape)
    if x.numel() == 0:
        return torch.ones(_scale_shape(x.shape, granularity, bm, bk))
    amax = _groups(x.float(), bm, bk).abs().amax(dim=(-2, -1))
    return torch.clamp_min(true_divide(amax, fmax), 1.0 / (fmax * _MIN_SCALE_DIVISOR))


_MIN_NORMAL_FP32 = 2.0**-126


def _check_scale(scale, want: tuple[int, ...]) -> torch.Tensor:
    if not isinstance(scale, torch.Tensor) or scale.dtype != torch.float32:
        raise TypeError(f"scale must be a float32 tensor, got {getattr(scale, 'dtype', type(scale))}")
    if tuple(scale.shape) != want:
        if scale.numel() == 1 and all(d == 1 for d in want[-2:]):
            scale = scale.reshape(()).expand(want)  # one per-tensor scale for every batch entry
        else:
            raise ValueError(f"scale must have shape {want} for this granularity, got {tuple(scale.shape)}")
    if not bool(torch.isfinite(scale).all()) or not bool((scale > 0).all()):
        raise ValueError("scale must be positive and finite")
    return scale


def quantize_fp8(
    x: torch.Tensor,
    fmt: FloatFormat,
    *,
    granularity: Granularity = Granularity.PER_TENSOR,
    block_shape: tuple[int, int] | None = None,
    scale: torch.Tensor | None = None,
    max_value: float | None = None,
    scale_apply: ScaleApply = ScaleApply.DIVIDE,
) -> FP8Quantized:
    """FP8 codes of x; `scale` given = static quantization, None = dynamic (computed from x)."""
    check_float_input(x)
    fmax = _check_fmt(fmt, max_value)
    bm, bk = fp8_group_shape(x.shape, granularity, block_shape)
    xf = x.float()
    if not bool(torch.isfinite(xf).all()):
        raise ValueError("x must be finite for FP8 quantization (NaN/Inf would poison the scale)")
    want = _scale_shape(x.shape, granularity, bm, bk)
    if scale is None:
        scale = fp8_dynamic_scale(xf, fmt, granularity, block_shape, max_value)
    else:
        scale = _check_scale(scale, want)
    g = _groups(xf, bm, bk)
    s = scale[..., None, None]
    if scale_apply is ScaleApply.DIVIDE:
        scaled = g / s
    elif scale_apply is ScaleApply.RECIPROCAL_MULTIPLY:
        if bool((scale < _MIN_NORMAL_FP32).any()):
            raise ValueError(f"scale must be a normal fp32 (>= 2^-126) with ScaleApply.RECIPROCAL_MULTIPLY: 1/scale "
                             f"of a smaller one overflows, got min {float(scale.min())!r}")
        scaled = g * (1.0 / s)
    else:
        raise TypeError(f"scale_apply must be a ScaleApply, got {scale_apply!r}")
    codes = encode_finite(scaled.clamp(-fmax, fmax), fmt, Overflow.SATURATE)
    return FP8Quantized(_ungroup(codes, x.shape), scale.contiguous())


def dequantize_fp8(
    codes: torch.Tensor,
    scale: torch.Tensor,
    fmt: FloatFormat,
    *,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """fl(decode(code) * scale); the group shape is read off the scale's shape [..., M/bm, K/bk]."""
    check_output_dtype(dtype)
    _check_fmt(fmt, None)
    check_codes(codes, fmt)
    if not isinstance(scale, torch.Tensor):
        raise TypeError(f"scale must be a float32 tensor of codes' rank, got {type(scale).__name__} {scale!r}")
    if codes.dim() < 2 or scale.dim() != codes.dim():
        raise ValueError(f"scale must have codes' rank {codes.dim()} (>= 2), got shape {tuple(scale.shape)}")
    m, k = codes.shape[-2:]
    sm, sk = scale.shape[-2:]
    if codes.numel() == 0:
        return torch.zeros(codes.shape, dtype=dtype)  # no rows: nothing to scale
    if sm == 0 or sk == 0 or m % sm or k % sk or tuple(scale.shape[:-2]) != tuple(codes.shape[:-2]):
        raise ValueError(f"scale of shape {tuple(scale.shape)} does not tile codes of shape {tuple(codes.shape)}")
    scale = _check_scale(scale, tuple(scale.shape))
    g = _groups(decode(codes, fmt), m // sm, k // sk)
    return _ungroup(g * scale[..., None, None], codes.shape).to(dtype)


def qdq_fp8(x: torch.Tensor, fmt: FloatFormat, *, dtype: torch.dtype = torch.float32, **kwargs) -> torch.Tensor:
    check_output_dtype(dtype)
    q = quantize_fp8(x, fmt, **kwargs)
    return dequantize_fp8(q.codes, q.scale, fmt, dtype=dtype)
