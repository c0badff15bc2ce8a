"""Small, precise corruptions of a checkpoint: one weight code moved by one step. The derived bound
must catch them (suites/test_moe_reference.py); issue-level seeded bugs build on the same helpers."""

from __future__ import annotations

from dataclasses import replace

import torch

from reference.checkpoints import MoECheckpoint, QuantizedWeight, dequantize_weight
from reference.packing import pack_fp4, unpack_fp4

__all__ = ["step_weight_codes", "step_one_weight_code", "rows_by_step_size"]

# The bf16 scheme has no codes; its "step" is the relative step of an E4M3 code (2^-3), the coarsest
# step an 8-bit element format takes. One bf16 ulp (2^-8 relative) of one weight is below what a bf16
# output can show, for any comparison.
_BF16_STEP = 2.0**-3


def _codes(w: QuantizedWeight, ckpt: MoECheckpoint) -> torch.Tensor:
    wq = ckpt.scheme.weight
    return unpack_fp4(w.data) if wq.elem.nbits == 4 else w.data


def _with_codes(w: QuantizedWeight, codes: torch.Tensor, ckpt: MoECheckpoint) -> QuantizedWeight:
    wq = ckpt.scheme.weight
    return replace(w, data=pack_fp4(codes) if wq.elem.nbits == 4 else codes)


def step_weight_codes(ckpt: MoECheckpoint, name: str, mask: torch.Tensor) -> MoECheckpoint:
    """Move every code of weight `name` ("w13"/"w2") where mask [E, N, K] is set by one step of its
    magnitude (up, or down at the largest finite code), keeping its sign."""
    w = getattr(ckpt, name)
    wq = ckpt.scheme.weight
    if wq is None:
        v = w.data.float()
        stepped = (v * (1 + _BF16_STEP)).to(torch.bfloat16)
        return ckpt.with_weight(name, replace(w, data=torch.where(mask, stepped, w.data)))
    fmt = wq.kind.code_format(wq, ckpt.fp8_format)
    codes = _codes(w, ckpt).int()
    mag = codes & (fmt.sign_bit - 1)
    new_mag = torch.where(mag < fmt.max_code, mag + 1, mag - 1)
    new = (codes & fmt.sign_bit) | new_mag
    codes = torch.where(mask, new, codes).to(torch.uint8)
    return ckpt.with_weight(name, _with_codes(w, codes, ckpt))


def rows_by_step_size(ckpt: MoECheckpoint, name: str, expert: int, column: int) -> list[int]:
    """Rows of (expert, :, column), ordered by how far one step of their code moves the weight."""
    w = getattr(ckpt, name)
    col = torch.zeros(_shape(ckpt, name), dtype=torch.bool)
    col[expert, :, column] = True
    before = dequantize_weight(w, ckpt.scheme.weight, ckpt)[expert, :, column]
    after = dequantize_weight(getattr(step_weight_codes(ckpt, name, col), name), ckpt.scheme.weight, ckpt)
    return torch.argsort((after[expert, :, column] - before).abs(), descending=True, stable=True).tolist()


def step_one_weight_code(ckpt: MoECheckpoint, name: str, expert: int, row: int, column: int) -> MoECheckpoint:
    """The checkpoint with the code of weight `name` at (expert, row, column) moved by one step."""
    one = torch.zeros(_shape(ckpt, name), dtype=torch.bool)
    one[expert, row, column] = True
    return step_weight_codes(ckpt, name, one)


def _shape(ckpt: MoECheckpoint, name: str) -> tuple[int, ...]:
    w = getattr(ckpt, name)
    return tuple(w.data.shape if ckpt.scheme.weight is None else _codes(w, ckpt).shape)
