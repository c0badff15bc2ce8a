"""Special values that real checkpoints and real serving batches carry, as data: each case turns a
conformance checkpoint (or the inputs) into one that carries the special value, and names a plausible
wrong answer a kernel could give, which the suite first shows to fail (suites/test_special_values.py).

E8M0 0xFF is NaN (the whole block), 0x00 is 2^-127 (fp32/bf16 subnormal weights), 0xFE is 2^127 (weights
of magnitude >= 2 overflow fp32 to Inf; Inf and NaN then reach the output in places that do not depend on
the accumulation order). NVFP4 block scales 0x00 (zero block) and 0x7E (448, the largest E4M3). FP8
per-tensor/per-block weight scales of 2^-100 and 2^50. Token rows past the real ones poisoned with NaN/Inf
(a kernel that rounds the token count up to its tile must not let them in).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import torch

from reference.checkpoints import MoECheckpoint
from reference.fp8 import ScaleApply

__all__ = ["SpecialCase", "SPECIAL_CASES", "poisoned_inputs", "padded_rows_leak", "POISON_ROWS"]

E8M0_NAN, E8M0_MIN, E8M0_MAX = 0xFF, 0x00, 0xFE
E4M3_ZERO, E4M3_MAX = 0x00, 0x7E
# the w2 rows of expert 0 that carry the special block scale (a few output columns, every token routed there)
SPECIAL_ROWS = slice(0, 4)


@dataclass(frozen=True)
class SpecialCase:
    name: str
    what: str  # the special value, in a sentence
    schemes: tuple[str, ...]  # the schemes it is run on (a kernel's scale path differs by weight kind)
    checkpoint: Callable[[MoECheckpoint], MoECheckpoint] | None = None  # the special checkpoint
    wrong: Callable[[MoECheckpoint], MoECheckpoint] | None = None  # how a plausibly wrong kernel reads it
    wrong_answer: str = ""  # what that wrong kernel does, in words
    poison_padding: bool = False  # inputs are views of a buffer whose rows past the real tokens are NaN/Inf
    biased: bool = True  # False where biases would drown what the special value changes (subnormal outputs)
    inputs: Callable | None = None  # (x, w, ids) -> (x, w, ids): special hidden states
    # a wrong answer that is a different numerical structure, not a different reading of the checkpoint
    wrong_structure: Callable | None = None


def _w2(ckpt: MoECheckpoint, **fields) -> MoECheckpoint:
    return dataclasses.replace(ckpt, w2=dataclasses.replace(ckpt.w2, **fields))


def _scale_rows(ckpt: MoECheckpoint, code: int, blocks=slice(0, 1)) -> MoECheckpoint:
    """w2 of expert 0: the first block of SPECIAL_ROWS gets block-scale code `code`."""
    scale = ckpt.w2.scale.clone()
    scale[0, SPECIAL_ROWS, blocks] = code
    return _w2(ckpt, scale=scale)


def _nan_block(ckpt):
    """What a quantizer writes for a block that held NaN/Inf (torchao): scale 0xFF, every code 0. The
    checkpoint means NaN there; a decode that reads 0xFF as a number gives 0 * 2^k = 0."""
    out = _scale_rows(ckpt, E8M0_NAN)
    data = out.w2.data.clone()
    data[0, SPECIAL_ROWS, : 16 if ckpt.scheme.weight.elem.nbits == 4 else 32] = 0
    return _w2(out, data=data)


def _nan_read_as_power_of_two(ckpt):
    # 0xFF decoded as 2^127 (an exponent-only decode with no NaN check)
    return _scale_rows(_nan_block(ckpt), E8M0_MAX)


def _max_scale_block(ckpt: MoECheckpoint) -> MoECheckpoint:
    """0xFE on blocks whose every code is the format's largest positive (6 for E2M1, 448 for E4M3): each
    weight is 2^127 times it, +Inf in fp32, so every product is +-Inf or NaN (0 * Inf) in any order and
    precision, and the outputs of those rows are NaN (or Inf where the activations share a sign)."""
    out = _scale_rows(ckpt, E8M0_MAX)
    data = out.w2.data.clone()
    top = ckpt.scheme.weight.elem.max_code
    if ckpt.scheme.weight.elem.nbits == 4:
        data[0, SPECIAL_ROWS, :16] = top | (top << 4)
    else:
        data[0, SPECIAL_ROWS, :32] = top
    return _w2(out, data=data)


def _max_scale_read_signed(ckpt):
    # the E8M0 byte read as a signed int8: 0xFE is -2, the block decodes to about 2^-129 (here 2^-127)
    special = _max_scale_block(ckpt)
    return _w2(special, scale=torch.where(special.w2.scale == E8M0_MAX, E8M0_MIN, special.w2.scale))


def _min_scale_everywhere(ckpt):
    return _w2(ckpt, scale=torch.full_like(ckpt.w2.scale, E8M0_MIN))


def _min_scale_flushed(ckpt):
    # fp32/bf16 subnormal weights flushed to zero (FTZ on the dequantized operand)
    special = _min_scale_everywhere(ckpt)
    return _w2(special, data=torch.zeros_like(special.w2.data))


def _large_scale_everywhere(ckpt):
    return _w2(ckpt, scale=torch.full_like(ckpt.w2.scale, 127 + 13))


def _large_scale_bias_off_by_one(ckpt):
    # the E8M0 bias taken as 128: every scale one binade low
    return _w2(ckpt, scale=torch.full_like(ckpt.w2.scale, 127 + 12))


def _nvfp4_extreme_block_scales(ckpt):
    scale = ckpt.w2.scale.clone()
    scale[0, SPECIAL_ROWS, 0] = E4M3_ZERO
    scale[0, SPECIAL_ROWS, 1] = E4M3_MAX
    return _w2(ckpt, scale=scale)


def _nvfp4_max_clamped_to_fnuz(ckpt):
    # block scales clamped to E4M3FNUZ's range (240 = FN code 0x77) by a kernel shared with MI300
    special = _nvfp4_extreme_block_scales(ckpt)
    return _w2(special, scale=torch.clamp(special.w2.scale, max=0x77))


def _fp8_extreme_weight_scales(ckpt):
    # expert 0's w2 scales 2^-100, expert 1's 2^50 (per-tensor [E,1,1] or per-block [E, N/128, K/128])
    scale = ckpt.w2.scale.clone()
    scale[0] = 2.0**-100
    scale[1] = 2.0**50
    return _w2(ckpt, scale=scale)


def _fp8_scales_in_fp16(ckpt):
    # the weight scale converted to fp16 with saturation (a half-precision epilogue): into [2^-24, 65504]
    special = _fp8_extreme_weight_scales(ckpt)
    return _w2(special, scale=special.w2.scale.clamp(2.0**-24, 65504.0))


# A static a1 scale s = 7 * 2^-8 and inputs s * m * 2^j with m = 1.5625 or 1.8125 (E4M3 midpoints, exact in
# bf16): x / s lands exactly on the midpoint (a tie: RNE keeps the even code), x * fl(1/s) one fp32 ulp
# off it (the other code). The two ways of applying a static scale (ScaleApply) differ on every such
# element. (Searched: of s = k * 2^-8, k odd < 256, with s * midpoint exact in bf16, only k = 7 separates
# the two; fl(1/s)'s relative error must exceed half an fp32 ulp of the midpoint.)
TIE_SCALE = 7 * 2.0**-8


def _static_scale_for_ties(ckpt):
    return dataclasses.replace(ckpt, w13_input_scale=torch.full_like(ckpt.w13_input_scale, TIE_SCALE))


def _tie_inputs(x, w, ids):
    """Every hidden-state element a tie: s * m * 2^j, j in [-2, 5], midpoints, signs and binades mixed."""
    t, h = x.shape
    i = torch.arange(t)[:, None] + torch.arange(h)[None, :]
    m = torch.where(i % 3 == 0, 1.8125, 1.5625)
    ties = TIE_SCALE * m * 2.0 ** ((i * 5 % 8) - 2).float()  # exact in bf16
    sign = 1.0 - 2.0 * ((i * 3 // 2) % 2).float()
    return (ties * sign).to(x.dtype), w, ids


def _other_scale_apply(structure):
    other = (ScaleApply.DIVIDE if structure.fp8_static_scale is ScaleApply.RECIPROCAL_MULTIPLY
             else ScaleApply.RECIPROCAL_MULTIPLY)
    return dataclasses.replace(structure, fp8_static_scale=other)


_MX = ("w_mxfp4", "w_mxfp8", "w_mxfp4_a_mxfp4")
SPECIAL_CASES: tuple[SpecialCase, ...] = (
    SpecialCase("e8m0_nan_block", "E8M0 scale 0xFF (NaN) on w2 blocks of expert 0", _MX, _nan_block,
                _nan_read_as_power_of_two, "0xFF decoded as the power of two 2^127"),
    SpecialCase("e8m0_max_scale", "E8M0 scale 0xFE (2^127) on w2 blocks holding codes of magnitude >= 2", _MX,
                _max_scale_block, _max_scale_read_signed, "the scale byte read as a signed int8 (0xFE as -2)"),
    SpecialCase("e8m0_min_scale", "E8M0 scale 0x00 (2^-127) on every w2 block: subnormal weights and outputs",
                ("w_mxfp4", "w_mxfp8"), _min_scale_everywhere, _min_scale_flushed,
                "subnormal weights flushed to zero", biased=False),
    SpecialCase("e8m0_large_scale", "E8M0 scale 2^13 on every w2 block: outputs far above the usual range",
                ("w_mxfp4", "w_mxfp8"), _large_scale_everywhere, _large_scale_bias_off_by_one,
                "the E8M0 bias taken as 128 (scales one binade low)"),
    SpecialCase("nvfp4_extreme_block_scales", "NVFP4 w2 block scales 0x00 (zero block) and 0x7E (448)",
                ("w_nvfp4", "w_nvfp4_a_nvfp4"), _nvfp4_extreme_block_scales, _nvfp4_max_clamped_to_fnuz,
                "block scales clamped to E4M3FNUZ's 240"),
    SpecialCase("fp8_extreme_weight_scales", "FP8 w2 weight scales 2^-100 (expert 0) and 2^50 (expert 1)",
                ("w_fp8_a_fp8", "w_fp8_a_fp8_block"), _fp8_extreme_weight_scales, _fp8_scales_in_fp16,
                "weight scales saturated to fp16's range"),
    SpecialCase("fp8_static_scale_ties", "hidden states on FP8 rounding midpoints of x / s for a static a1 scale",
                ("w_fp8_a_fp8", "w_mxfp4_a_fp8"), _static_scale_for_ties, inputs=_tie_inputs,
                wrong_structure=_other_scale_apply,
                wrong_answer="the static scale applied the other way (x / s versus x * fl(1/s))"),
    SpecialCase("poisoned_padding", "NaN/Inf token rows past the real tokens in the input buffers",
                ("bf16", "w_mxfp4", "w_fp8_a_fp8", "w_nvfp4_a_nvfp4"), poison_padding=True,
                wrong_answer="padded rows computed and summed into token 0"),
)
POISON_ROWS = 5  # NaN, +Inf, -Inf, NaN, +Inf past the real tokens


def poisoned_inputs(x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor, device="cpu"):
    """(x, w, ids) on `device` as leading views of buffers whose POISON_ROWS further rows are NaN/Inf
    (hidden states and router weights; ids there are valid experts): what a kernel reading past the
    real tokens finds."""
    poison = torch.tensor([float("nan"), float("inf"), float("-inf"), float("nan"), float("inf")])
    t = x.shape[0]
    xb = torch.cat([x.float(), poison[:, None].expand(POISON_ROWS, x.shape[1])]).to(x.dtype).to(device)
    wb = torch.cat([w, poison[:, None].expand(POISON_ROWS, w.shape[1])]).to(device)
    ib = torch.cat([ids, torch.zeros(POISON_ROWS, ids.shape[1], dtype=ids.dtype)]).to(device)
    return xb[:t], wb[:t], ib[:t]


def padded_rows_leak(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The wrong answer of poisoned_padding: a kernel that rounds the token count up to its tile reads the
    first padded row and lets it reach token 0."""
    t = x.shape[0]
    past = x.as_strided((t + 1, x.shape[1]), x.stride())[t]
    leaked = out.clone()
    leaked[0] += past.to(out.device)
    return leaked
