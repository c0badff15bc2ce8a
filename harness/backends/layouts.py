"""Backend layouts owned by the harness, with their round trips (the reference is logical only).

Blackwell block-scaled GEMMs (cuBLAS, torch._scaled_mm on sm100) take block scales "swizzled" in
128x4 tiles: rows padded to a multiple of 128, columns (scale blocks along K) to a multiple of 4;
tiles are stored row-tile major, 512 bytes each, and inside a tile scale (r, c) sits at byte
(r % 32) * 16 + (r // 32) * 4 + c. Mixing this layout with the linear one is a real bug class.
"""

from __future__ import annotations

import torch

__all__ = ["swizzle_scales_128x4", "unswizzle_scales_128x4"]


def _check(scales: torch.Tensor, arg: str) -> None:
    if not isinstance(scales, torch.Tensor) or scales.dim() != 2:
        raise ValueError(f"{arg} must be a 2-D [rows, K / block] tensor, got {getattr(scales, 'shape', type(scales))}")


def swizzle_scales_128x4(scales: torch.Tensor) -> torch.Tensor:
    """[R, C] scales (any 1-byte dtype) -> flat [ceil(R/128)*128 * ceil(C/4)*4] in the 128x4 tiled layout.
    Padding is zero."""
    _check(scales, "scales")
    r, c = scales.shape
    rp, cp = -(-r // 128) * 128, -(-c // 4) * 4
    padded = torch.zeros(rp, cp, dtype=scales.dtype, device=scales.device)
    padded[:r, :c] = scales
    # [rt, 128, ct, 4] -> rows split as (r // 32 within tile = 4, r % 32 = 32)
    t = padded.view(rp // 128, 4, 32, cp // 4, 4)  # (row tile, r//32, r%32, col tile, c)
    t = t.permute(0, 3, 2, 1, 4)  # (row tile, col tile, r%32, r//32, c): byte (r%32)*16 + (r//32)*4 + c
    return t.contiguous().view(-1)


def unswizzle_scales_128x4(swizzled: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """The inverse: flat swizzled scales -> [rows, cols]."""
    rp, cp = -(-rows // 128) * 128, -(-cols // 4) * 4
    if swizzled.numel() != rp * cp:
        raise ValueError(f"swizzled holds {swizzled.numel()} scales; [{rows}, {cols}] padded to 128x4 tiles needs {rp * cp}")
    t = swizzled.reshape(rp // 128, cp // 4, 32, 4, 4).permute(0, 3, 2, 1, 4)
    return t.reshape(rp, cp)[:rows, :cols]
