"""NVFP4: E2M1 elements in blocks of 16 along the last dim, an E4M3FN block scale, an fp32 tensor scale.

Two directions of the tensor scale exist in the wild and a wrong multiply/divide by it is a real bug:
  encode scale  s_enc = 448 * 6 / amax_tensor     (compressed-tensors stores this direction)
  decode scale  s_dec = 1 / s_enc                  (ModelOpt's `weight_scale_2`)
The API names the direction; pass exactly one, or neither to compute s_enc from the tensor's amax.

  stored block scale  = E4M3FN(RNE, satfinite)(fl(amax_block / 6) * s_enc)
  element             = E2M1(RNE, saturate)(fl(x / fl(fp32(stored) * s_dec)))   (0 where stored is 0)
  dequantized value   = fl(e2m1 * fp32(stored) * s_dec)   (e2m1 * stored is exact: one rounding)
Variants (NUMERICS.md) differ in the block scale of small blocks:
  TRTLLM   (default) all-zero block stores 0x00; a block scale below E4M3's range rounds to 0 and its
           elements quantize to 0 (TensorRT-LLM multiplies by a zero reciprocal)
  TORCHAO  block scale clamped to >= 2^-6 (E4M3's smallest normal) before the cast: zero block -> 0x08
  MODELOPT ModelOpt 0.47's NVFP4QTensor: block scale fl(amax_block / fl(6 s_dec)), a zero quotient (an all-zero
           block) stores 1.0 (0x38), then clamped to [2^-9, 448] before the cast (tiny blocks store 2^-9, never 0);
           checked bit for bit against ModelOpt itself in suites/test_peers_modelopt.py
  COMPRESSED_TENSORS  compressed-tensors 0.20 (llm-compressor's NVFP4 checkpoints, encode direction): the
           block scale is TRTLLM's, but a code of 0 (an all-zero block, or one whose scale rounds below E4M3's
           range) is replaced by 0.125 (0x20, its E4M3 "eps"), and elements are divided by fl(fp32(stored) / s_enc)
           rather than fl(fp32(stored) * s_dec) (s_enc = fl(1 / s_dec) when s_dec is given). A replaced block's
           elements all quantize to 0 (|x| s_enc / 6 < 2^-10, so |x| / (0.125 / s_enc) < 0.047); checked bit for bit
           against compressed-tensors itself in suites/test_peers_compressed_tensors.py
"""

from __future__ import annotations

import enum
from typing import NamedTuple

import torch

from .formats import (
    E2M1,
    E4M3FN,
    Overflow,
    check_codes,
    check_float_input,
    check_output_dtype,
    decode,
    encode_finite,
    round_to_format_grid,
    true_divide,
)

__all__ = [
    "NVFP4_BLOCK_SIZE",
    "NVFP4_MIN_AMAX",
    "NVFP4Variant",
    "NVFP4Quantized",
    "nvfp4_global_encode_scale",
    "nvfp4_block_scale_codes",
    "quantize_nvfp4",
    "dequantize_nvfp4",
    "qdq_nvfp4",
]

NVFP4_BLOCK_SIZE = 16
_E2M1_MAX = 6.0
_E4M3_MAX = 448.0


class NVFP4Variant(enum.Enum):
    TRTLLM = "trtllm"
    TORCHAO = "torchao"
    MODELOPT = "modelopt"
    COMPRESSED_TENSORS = "compressed_tensors"


class NVFP4Quantized(NamedTuple):
    codes: torch.Tensor  # uint8 E2M1 codes, x's shape (unpacked; reference.packing.pack_fp4 packs them)
    block_scales: torch.Tensor  # uint8 E4M3FN codes, [..., K / 16]
    global_decode_scale: torch.Tensor  # fp32, broadcastable to block_scales: dequant multiplies by it


NVFP4_MIN_AMAX = float(_E4M3_MAX * _E2M1_MAX) * 2.0**-126  # the smallest nonzero amax with normal scales


def nvfp4_global_encode_scale(amax: torch.Tensor | float) -> torch.Tensor:
    """s_enc = fl(448 * 6 / amax), fp32; 1.0 where amax is 0 (every block is then zero).

    An amax below NVFP4_MIN_AMAX = 2688 * 2^-126 (about 3.2e-35) is rejected: s_enc would exceed 2^126, so the
    decode scale 1 / s_enc would be subnormal (or s_enc overflow fp32), which dequantize_nvfp4 refuses as it
    refuses any global scale outside [2^-126, 2^126]."""
    amax = torch.as_tensor(amax, dtype=torch.float32)
    s_enc = torch.where(amax > 0, (_E4M3_MAX * _E2M1_MAX) / amax, torch.ones_like(amax))
    if not bool(torch.isfinite(s_enc).all()) or bool((s_enc > 2.0**126).any()):
        raise ValueError(f"amax {amax.min().item():.3g} is too small for NVFP4: 2688 / amax exceeds 2^126, and its "
                         f"reciprocal (the decode scale) would not be a normal fp32 (amax must be 0 or >= "
                         f"{NVFP4_MIN_AMAX:.3g})")
    return s_enc


def _check_global(t, arg: str) -> torch.Tensor:
    t = torch.as_tensor(t)
    if t.dtype != torch.float32:
        raise TypeError(f"{arg} must be float32, got {t.dtype}")
    if not bool(torch.isfinite(t).all()) or not bool((t > 0).all()):
        raise ValueError(f"{arg} must be positive and finite")
    # the scale and its reciprocal must both be normal fp32, or one side of the arithmetic saturates
    # or flushes every value silently
    if bool(((t < 2.0**-126) | (t > 2.0**126)).any()):
        raise ValueError(f"{arg} must lie in [2^-126, 2^126] (it and its reciprocal normal fp32), got values in "
                         f"[{float(t.min())!r}, {float(t.max())!r}]")
    return t


def _scales(x: torch.Tensor, global_encode_scale, global_decode_scale, variant: NVFP4Variant):
    check_float_input(x)
    if x.dim() == 0 or x.shape[-1] % NVFP4_BLOCK_SIZE:
        raise ValueError(
            f"x's last dim must be divisible by the NVFP4 block {NVFP4_BLOCK_SIZE}, got shape {tuple(x.shape)}"
        )
    if not isinstance(variant, NVFP4Variant):
        raise TypeError(f"variant must be an NVFP4Variant, got {variant!r}")
    xf = x.float()
    if not bool(torch.isfinite(xf).all()):
        raise ValueError("x must be finite: NVFP4 has no encoding for NaN or Inf")
    if global_encode_scale is not None and global_decode_scale is not None:
        raise ValueError("pass global_encode_scale or global_decode_scale, not both")
    if global_decode_scale is not None:
        s_dec = _check_global(global_decode_scale, "global_decode_scale")
        s_enc = 1.0 / s_dec
    else:
        if global_encode_scale is None:
            s_enc = nvfp4_global_encode_scale(xf.abs().amax() if xf.numel() else torch.tensor(0.0))
        else:
            s_enc = _check_global(global_encode_scale, "global_encode_scale")
        s_dec = 1.0 / s_enc
    xb = xf.reshape(*xf.shape[:-1], xf.shape[-1] // NVFP4_BLOCK_SIZE, NVFP4_BLOCK_SIZE)
    amax_b = xb.abs().amax(dim=-1)
    try:
        s_enc_b = torch.broadcast_to(s_enc, amax_b.shape)
        s_dec_b = torch.broadcast_to(s_dec, amax_b.shape)
    except RuntimeError:
        raise ValueError(
            f"the global scale of shape {tuple(s_enc.shape)} does not broadcast to the block scales "
            f"{tuple(amax_b.shape)}"
        ) from None
    stored = nvfp4_block_scale_codes(amax_b, s_enc_b, variant, s_dec_b)
    # COMPRESSED_TENSORS divides the stored scale by s_enc where the others multiply it by s_dec
    return xb, stored, s_dec, s_dec_b, (s_enc_b if variant is NVFP4Variant.COMPRESSED_TENSORS else None)


def nvfp4_block_scale_codes(
    amax_block: torch.Tensor, global_encode_scale: torch.Tensor, variant: NVFP4Variant = NVFP4Variant.TRTLLM,
    global_decode_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """E4M3FN(RNE, satfinite)(fl(amax_block / 6) * s_enc) as uint8 codes, with the variant's rule for
    small and zero blocks (MODELOPT divides by fl(6 s_dec) instead: s_dec defaults to 1 / s_enc). Monotone
    non-decreasing in amax_block > 0 (an all-zero block's code is the variant's own rule), except under
    COMPRESSED_TENSORS, whose tiny blocks (code 0) store 0x20."""
    if variant is NVFP4Variant.MODELOPT:
        s_dec = 1.0 / global_encode_scale if global_decode_scale is None else global_decode_scale
        block = true_divide(amax_block.float(), _E2M1_MAX * s_dec)
        block = torch.where(block == 0, 1.0, block).clamp(E4M3FN.min_subnormal, _E4M3_MAX)
        return encode_finite(block, E4M3FN, Overflow.SATURATE)
    block = true_divide(amax_block.float(), _E2M1_MAX) * global_encode_scale
    if variant is NVFP4Variant.TORCHAO:
        block = block.clamp_min(E4M3FN.min_normal)
    codes = encode_finite(block, E4M3FN, Overflow.SATURATE)
    if variant is NVFP4Variant.COMPRESSED_TENSORS:
        # a scale that rounded to 0 becomes 0.125 = 2^-3 (E4M3 exponent field 4, mantissa 0): code 0x20
        codes = torch.where(codes == 0, torch.full_like(codes, 0x20), codes)
    return codes


def _element_input(xb, stored, s_dec_b, s_enc_b=None):
    """fl(x / d) with d = fl(fp32(stored) * s_dec), or d = fl(fp32(stored) / s_enc) where s_enc_b is given (the
    two differ in the last bit for some scales); 0 where d is 0."""
    denom = decode(stored, E4M3FN) * s_dec_b if s_enc_b is None else decode(stored, E4M3FN) / s_enc_b
    safe = torch.where(denom == 0, 1.0, denom)
    return torch.where((denom == 0)[..., None], xb * 0.0, xb / safe[..., None])


def quantize_nvfp4(
    x: torch.Tensor,
    *,
    global_encode_scale: torch.Tensor | None = None,
    global_decode_scale: torch.Tensor | None = None,
    variant: NVFP4Variant = NVFP4Variant.TRTLLM,
) -> NVFP4Quantized:
    xb, stored, s_dec, s_dec_b, s_enc_b = _scales(x, global_encode_scale, global_decode_scale, variant)
    codes = encode_finite(_element_input(xb, stored, s_dec_b, s_enc_b), E2M1, Overflow.SATURATE)
    return NVFP4Quantized(codes.reshape(x.shape), stored, s_dec)


def dequantize_nvfp4(
    codes: torch.Tensor,
    block_scales: torch.Tensor,
    global_decode_scale: torch.Tensor,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    check_output_dtype(dtype)
    check_codes(codes, E2M1)
    check_codes(block_scales, E4M3FN, "block_scales")
    if codes.dim() == 0 or codes.shape[-1] % NVFP4_BLOCK_SIZE:
        raise ValueError(f"codes' last dim must be divisible by {NVFP4_BLOCK_SIZE}, got shape {tuple(codes.shape)}")
    want = (*codes.shape[:-1], codes.shape[-1] // NVFP4_BLOCK_SIZE)
    if tuple(block_scales.shape) != want:
        raise ValueError(f"block_scales must have shape {want} for codes {tuple(codes.shape)}, "
                         f"got {tuple(block_scales.shape)}")
    s_dec = _check_global(global_decode_scale, "global_decode_scale")
    try:
        torch.broadcast_shapes(s_dec.shape, want)
    except RuntimeError:
        raise ValueError(f"global_decode_scale of shape {tuple(s_dec.shape)} does not broadcast to the block scales' "
                         f"shape {want} (one per tensor, or one per leading index such as [E, 1, 1])") from None
    cb = codes.reshape(*want, NVFP4_BLOCK_SIZE)
    v = decode(cb, E2M1) * decode(block_scales, E4M3FN)[..., None] * s_dec[..., None]
    return v.reshape(codes.shape).to(dtype)


def qdq_nvfp4(
    x: torch.Tensor,
    *,
    global_encode_scale: torch.Tensor | None = None,
    global_decode_scale: torch.Tensor | None = None,
    variant: NVFP4Variant = NVFP4Variant.TRTLLM,
    dtype: torch.dtype = torch.float32,
    block_scales: torch.Tensor | None = None,
) -> torch.Tensor:
    """Values directly (rounded on E2M1's grid, never through codes): must equal dequantize(quantize(x)).

    block_scales (uint8 E4M3FN codes, [..., K/16]) fixes the block scales instead of deriving them."""
    check_output_dtype(dtype)
    xb, stored, _, s_dec_b, s_enc_b = _scales(x, global_encode_scale, global_decode_scale, variant)
    if block_scales is not None:
        check_codes(block_scales, E4M3FN, "block_scales")
        if block_scales.shape != stored.shape:
            raise ValueError(f"block_scales must have shape {tuple(stored.shape)}, got {tuple(block_scales.shape)}")
        stored = block_scales
    xs = _element_input(xb, stored, s_dec_b, s_enc_b)
    rounded, _ = round_to_format_grid(xs.abs(), E2M1)
    e2m1 = torch.copysign(rounded.clamp_max_(_E2M1_MAX), xs)
    v = e2m1 * decode(stored, E4M3FN)[..., None] * s_dec_b[..., None]
    return v.reshape(x.shape).to(dtype)
