"""The value contract of a bit-placement FP4 decode (issue 15; ../shared/PERF.md), emulated in torch so that
it is checked exhaustively on the CPU before any kernel relies on it.

An E2M1 code s|e1 e0|m (sign, two exponent bits, one mantissa bit) becomes bf16 by placement alone:

    bits = s << 15 | (e1 e0 m) << 6          (no lookup, no integer-to-float conversion)

which is the bf16 value v * 2^-126 (the code's exponent bits land in the low bits of bf16's biased exponent;
the subnormal 0.5 lands as a bf16 subnormal). One bf16 multiply restores the value and applies the E8M0
block scale at once: v * 2^(E - 127) = bits * 2^(E - 1), exact because every product is a bf16 value (one
significant mantissa bit) within bf16's range. 2^(E - 1) is itself a bf16 value only for E <= 128 (block
scales up to 2); a kernel that folds the bias into the scale must decline checkpoints with larger scales,
or split the multiply in two (2^126, then 2^(E - 127)): both are emulated here. E = 0xFF (NaN) is not a
power of two: declined. The placement assumes round-to-nearest bf16 multiplies that keep subnormal inputs
(PTX mul.rn.bf16x2 does; the CPU's bf16 multiply does).
"""

from __future__ import annotations

import torch

__all__ = ["E8M0_FOLDABLE_MAX", "place_e2m1", "place_e4m3", "scale_placed", "decode_mxfp4_bitplace"]

E8M0_FOLDABLE_MAX = 128  # 2^(E - 1) is a bf16 normal for E - 1 <= 127
_E8M0_NAN = 0xFF


def place_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """uint8 E2M1 codes (one per byte, 0..15) -> bf16 tensors holding code value * 2^-126, by placing bits."""
    if codes.dtype != torch.uint8:
        raise TypeError(f"codes must be uint8 E2M1 codes, got {codes.dtype}")
    c = codes.to(torch.int32)
    bits = ((c & 0x8) << 12) | ((c & 0x7) << 6)
    return bits.to(torch.int16).view(torch.bfloat16)


def place_e4m3(codes: torch.Tensor) -> torch.Tensor:
    """uint8 E4M3FN codes -> bf16 tensors holding code value * 2^-120, by placing bits (sign to bit 15, the
    seven exponent and mantissa bits to bits 4..10): E4M3's bias 7 against bf16's 127 is the 2^-120, and its
    subnormals land as bf16 subnormals of the same scaled value. The NaN codes 0x7F / 0xFF land as finite
    numbers: a kernel using this declines them (NVFP4 block scales are never NaN in a valid checkpoint)."""
    if codes.dtype != torch.uint8:
        raise TypeError(f"codes must be uint8 E4M3 codes, got {codes.dtype}")
    c = codes.to(torch.int32)
    return (((c & 0x80) << 8) | ((c & 0x7F) << 4)).to(torch.int16).view(torch.bfloat16)


def scale_placed(placed: torch.Tensor, scales: torch.Tensor, *, fold: bool = True) -> torch.Tensor:
    """placed [..., K] (place_e2m1) times the E8M0 scales [..., K / 32], in bf16 multiplies: one by 2^(E - 1)
    (fold=True; every scale must be <= E8M0_FOLDABLE_MAX), or by 2^126 and then by 2^(E - 127)."""
    if scales.dtype != torch.uint8:
        raise TypeError(f"scales must be uint8 E8M0 codes, got {scales.dtype}")
    if bool((scales == _E8M0_NAN).any()):
        raise ValueError("E8M0 scale 0xFF (NaN) has no power-of-two factor: a bit-placement decode declines it")
    e = scales.to(torch.int32).repeat_interleave(32, dim=-1)
    if fold:
        if bool((e > E8M0_FOLDABLE_MAX).any()):
            raise ValueError(f"E8M0 scales above {E8M0_FOLDABLE_MAX} (block scale > 2) cannot fold the 2^126 bias into "
                             "one bf16 factor; decline or multiply twice (fold=False)")
        return placed * _pow2_bf16(e - 1)
    return (placed * _pow2_bf16(torch.full_like(e, 126))) * _pow2_bf16(e - 127)


def _pow2_bf16(k: torch.Tensor) -> torch.Tensor:
    """2^k as bf16 for k in [-133, 127] (bf16 subnormals below -126), built from bits."""
    if bool(((k < -133) | (k > 127)).any()):
        raise ValueError("2^k outside bf16's range")
    normal = ((k + 127).clamp_min(0) << 7)
    subnormal = torch.where(k < -126, 1 << (k + 133).clamp(0, 6), 0)
    return torch.where(k >= -126, normal, subnormal).to(torch.int16).view(torch.bfloat16)


def decode_mxfp4_bitplace(packed: torch.Tensor, scales: torch.Tensor, *, fold: bool = True) -> torch.Tensor:
    """MXFP4 weights [..., K / 2] (two codes per byte, low nibble first) and E8M0 scales [..., K / 32] -> bf16
    values [..., K], through bit placement and bf16 multiplies only."""
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)
    return scale_placed(place_e2m1(codes), scales, fold=fold)
