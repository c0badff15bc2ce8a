"""FP4 packing: two E2M1 codes per byte, element 2j in the LOW nibble, element 2j+1 in the HIGH nibble.

This is the order of the OCP tooling, torchao, ModelOpt, TensorRT-LLM and Triton's tl.dot_scaled
(checked on an H200). A swapped nibble order is a real bug class, so both directions are explicit here.
"""

from __future__ import annotations

import torch

__all__ = ["pack_fp4", "unpack_fp4"]


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """[..., K] uint8 codes < 16 -> [..., K/2] uint8 bytes, packed along the last dim."""
    if not isinstance(codes, torch.Tensor) or codes.dtype != torch.uint8:
        raise TypeError(f"codes must be a uint8 tensor of 4-bit codes, got {getattr(codes, 'dtype', type(codes))}")
    if codes.dim() == 0 or codes.shape[-1] % 2:
        raise ValueError(f"codes' last dim must be even to pack two per byte, got shape {tuple(codes.shape)}")
    if codes.numel() and int(codes.max()) > 0xF:
        raise ValueError(f"codes holds {int(codes.max()):#x}; 4-bit codes must be < 0x10")
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """[..., K/2] uint8 bytes -> [..., K] uint8 codes (low nibble first)."""
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8:
        raise TypeError(f"packed must be a uint8 tensor, got {getattr(packed, 'dtype', type(packed))}")
    if packed.dim() == 0:
        raise ValueError("packed must have at least one dimension")
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)
