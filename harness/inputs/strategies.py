"""Inputs, in three tiers: named corner cases with expected bytes, exhaustive grids, and Hypothesis
strategies that plant structure (exact ties, values just below a power of two, +-max and just above,
fp32 and element subnormals, zero blocks, wide dynamic range across blocks)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from hypothesis import strategies as st

from reference import formats as F
from reference.mx import MX_BLOCK_SIZE, ScaleMode, quantize_mx
from reference.nvfp4 import nvfp4_global_encode_scale, quantize_nvfp4
from reference.packing import pack_fp4
from reference.fp8 import quantize_fp8

# ---------------------------------------------------------------------------------------------
# Tier 1: named corner cases. Each computes bytes from inputs with the reference and states what the
# bytes must be and why, one sentence of arithmetic each.


@dataclass(frozen=True)
class CornerCase:
    name: str
    compute: Callable[[], list[int]]
    expected: list[int]
    why: str


def _elements(fmt, values, overflow=F.Overflow.SATURATE):
    return lambda: F.encode(torch.tensor(values, dtype=torch.float32), fmt, overflow).tolist()


def _mx_block(fmt, values, mode):
    def compute():
        x = torch.zeros(MX_BLOCK_SIZE)
        x[: len(values)] = torch.tensor(values, dtype=torch.float32)
        q = quantize_mx(x, fmt, scale_mode=mode)
        return [int(q.scales[0])] + q.codes[: len(values)].tolist()

    return compute


def _nvfp4_block(values, tensor_amax):
    def compute():
        x = torch.zeros(16)
        x[: len(values)] = torch.tensor(values, dtype=torch.float32)
        q = quantize_nvfp4(x, global_encode_scale=nvfp4_global_encode_scale(tensor_amax))
        return [int(q.block_scales[0])] + pack_fp4(q.codes)[: len(values) // 2].tolist()

    return compute


def _fp8_zero_tensor():
    q = quantize_fp8(torch.zeros(1, 2), F.E4M3FN)
    return q.codes.flatten().tolist() + [int(q.scale.view(torch.int32))]


CORNER_CASES: tuple[CornerCase, ...] = (
    CornerCase("e2m1_ties", _elements(F.E2M1, [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]), [0, 2, 2, 4, 4, 6, 6],
               "ties go to the even code: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4"),
    CornerCase("e2m1_above_tie_and_saturation", _elements(F.E2M1, [5.0001, 7.0, -7.0, 1e30]), [7, 7, 15, 7],
               "5.0001 is past the 4|6 midpoint so 6; 7 and 1e30 saturate to 6 (0x7), -7 to -6 (0xF)"),
    CornerCase("e2m1_negative_zero", _elements(F.E2M1, [-0.0, -0.2]), [8, 8],
               "-0 and -0.2 (below the 0|0.5 midpoint 0.25) both give -0 = 0x8"),
    CornerCase("e4m3fn_ties", _elements(F.E4M3FN, [17.0, 19.0, 464.0]), [0x58, 0x5A, 0x7E],
               "spacing is 2 in [16,32): 17->16 (0x58), 19->20 (0x5A); 464 is the 448|480 midpoint -> 448 (0x7E)"),
    CornerCase("e4m3fn_subnormal_ties", _elements(F.E4M3FN, [2.0**-10, 1.5 * 2.0**-10, 3 * 2.0**-10]), [0, 1, 2],
               "the subnormal step is 2^-9: 2^-10 ties to 0, 1.5*2^-10 is above the tie -> 2^-9, 3*2^-10 -> 2*2^-9"),
    CornerCase("e4m3fn_overflow_nonfinite", _elements(F.E4M3FN, [480.0, -1e6], F.Overflow.NONFINITE), [0x7F, 0xFF],
               "480 rounds above 448 and E4M3FN has no Inf: NaN (0x7F, sign kept 0xFF)"),
    CornerCase("e4m3fnuz_max_and_no_negative_zero", _elements(F.E4M3FNUZ, [240.0, 250.0, -0.0, -1e-9]),
               [0x7F, 0x7F, 0x00, 0x00],
               "FNUZ max is 240 (0x7F), 250 saturates to it; -0 and tiny negatives are +0 because 0x80 is NaN"),
    CornerCase("e5m2_overflow_to_inf", _elements(F.E5M2, [57344.0, 61440.0, -61440.0], F.Overflow.NONFINITE),
               [0x7B, 0x7C, 0xFC],
               "61440 is the 57344|65536 midpoint and ties to the even 65536 = Inf (0x7C)"),
    CornerCase("e8m0_powers_and_tie", _elements(F.E8M0, [1.0, 1.5, 1.49, 2.0**-127, 2.0**127]), [127, 128, 127, 0, 254],
               "E8M0 holds 2^(code-127); 1.5*2^0 ties up to 2^1"),
    CornerCase("mx_e2m1_floor_basic", _mx_block(F.E2M1, [6.0, 1.0, 0.25], ScaleMode.FLOOR), [0x7F, 7, 2, 0],
               "amax 6: floor(log2 6) - 2 = 0 -> scale 2^0 (0x7F); 6->0x7, 1->0x2, 0.25 ties to 0"),
    CornerCase("mx_e2m1_floor_saturates", _mx_block(F.E2M1, [7.0, 1.3, -0.75], ScaleMode.FLOOR), [0x7F, 7, 3, 0xA],
               "FLOOR keeps scale 2^0 for amax 7, so 7 saturates to 6; 1.3->1.5 (0x3); -0.75 ties to -1 (0xA)"),
    CornerCase("mx_e2m1_rceil", _mx_block(F.E2M1, [7.0, 1.3, -0.75], ScaleMode.RCEIL), [0x80, 6, 1, 9],
               "RCEIL: 7 * fl(1/6) = 1.17 rounds up to 2^1 (0x80); 3.5->4 (0x6), 0.65->0.5 (0x1), -0.375->-0.5 (0x9)"),
    CornerCase("fp8_zero_tensor_dynamic_scale", lambda: _fp8_zero_tensor(), [0, 0, 0x36924925],
               "amax 0: the dynamic scale is its floor fl(1/(448*512)) = 4.3597e-6 (fp32 bits 0x36924925), codes 0"),
    CornerCase("mx_e2m1_even_carries", _mx_block(F.E2M1, [7.0, 1.3, -0.75], ScaleMode.EVEN), [0x80, 6, 1, 9],
               "EVEN: 7 = 1.75*2^2 rounds to one mantissa bit as 2.0*2^2 (tie to even), carrying the exponent to 3: "
               "3 - 2 = 1 (0x80)"),
    CornerCase("mx_e2m1_even_no_carry", _mx_block(F.E2M1, [5.9, 1.0], ScaleMode.EVEN), [0x7F, 7, 2],
               "EVEN: 5.9 = 1.475*2^2 rounds to 1.5*2^2, no carry: 2 - 2 = 0 (0x7F); 5.9 -> 6 (0x7)"),
    CornerCase("mx_e2m1_ceil", _mx_block(F.E2M1, [4.5, 1.0], ScaleMode.CEIL), [0x80, 4, 1],
               "CEIL: ceil(log2 4.5) - 2 = 1 (0x80); 4.5/2 = 2.25 -> 2 (0x4), 1/2 = 0.5 (0x1)"),
    CornerCase("mx_e2m1_ceil_power_of_two", _mx_block(F.E2M1, [4.0, 1.0], ScaleMode.CEIL), [0x7F, 6, 2],
               "CEIL of an exact power of two is its own exponent: log2 4 - 2 = 0 (0x7F)"),
    CornerCase("mx_e2m1_power_of_two_amax", _mx_block(F.E2M1, [8.0, 3.0, 1.0], ScaleMode.FLOOR), [0x80, 6, 3, 1],
               "amax 8: floor(log2 8) - 2 = 1 -> 0x80; 4->0x6, 1.5->0x3, 0.5->0x1"),
    CornerCase("mx_e2m1_log2_pitfall", _mx_block(F.E2M1, [7.9999995], ScaleMode.FLOOR), [0x7F, 7],
               "log2(7.9999995f) rounds to 3.0 in fp32; the exponent bits say 2, so scale 0x7F and 6 (0x7), not 0x80/4"),
    CornerCase("mx_e4m3_floor", _mx_block(F.E4M3FN, [500.0, 1.0], ScaleMode.FLOOR), [0x7F, 0x7E, 0x38],
               "floor(log2 500) - 8 = 0: 500 saturates to 448 (0x7E); 1.0 is 0x38"),
    CornerCase("mx_e4m3_rceil", _mx_block(F.E4M3FN, [500.0, 1.0], ScaleMode.RCEIL), [0x80, 0x78, 0x30],
               "RCEIL: 500/448 rounds up to 2^1: 250 (0x78), 0.5 (0x30)"),
    CornerCase("mx_e4m3_tiny_block", _mx_block(F.E4M3FN, [2.0**-130], ScaleMode.FLOOR), [0x00, 0x20],
               "shared exponent -138 clamps to -127 (0x00); 2^-130 / 2^-127 = 2^-3 is code 0x20"),
    CornerCase("mx_zero_block", _mx_block(F.E2M1, [0.0], ScaleMode.FLOOR), [0x00, 0],
               "an all-zero block has scale 0x00 and zero elements"),
    CornerCase("mx_nan_block", _mx_block(F.E2M1, [1.0, float("nan")], ScaleMode.FLOOR), [0xFF, 0, 0],
               "a block holding NaN gets the NaN scale 0xFF (its element codes are 0)"),
    CornerCase("mx_inf_block", _mx_block(F.E4M3FN, [float("inf"), 1.0], ScaleMode.FLOOR), [0xFF, 0, 0],
               "a block holding Inf gets the NaN scale 0xFF too"),
    CornerCase("nvfp4_block_at_tensor_amax", _nvfp4_block([10, 1, -3.3, 2.5, 0.4, 0.45, -10, 0], 10.0),
               [0x7E, 0x17, 0x3C, 0x10, 0x0F],
               "s_enc = 2688/10; block scale 10/6*268.8 = 448 (0x7E); x/1.667: 6,0.6,-1.98,1.5,.24,.27,-6 -> codes "
               "7,1,C,3,0,1,F,0, low nibble first"),
    CornerCase("nvfp4_small_block", _nvfp4_block([1, 0.5, -0.25, 0.7, 0.2, 0.1, -1, 0], 10.0),
               [0x63, 0x57, 0x6B, 0x12, 0x0F],
               "block scale 1/6*268.8 = 44.8 rounds to 44 (0x63); x/0.1637: 6.1,3.05,-1.53,4.28,1.22,.61,-6.1 -> "
               "7,5,B,6,2,1,F,0"),
)

# ---------------------------------------------------------------------------------------------
# Tier 2: exhaustive grids.


def all_bf16_as_fp32() -> torch.Tensor:
    """Every bf16 bit pattern (65536 values, NaNs and Infs included) widened to fp32 exactly."""
    return torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()


def random_fp32_near(fmt: F.FloatFormat, n: int, seed: int) -> torch.Tensor:
    """n random finite fp32 values whose exponents cover fmt's range and a margin either side, with
    uniformly random mantissa bits (so ties and near-ties of every binade occur), both signs."""
    g = torch.Generator().manual_seed(seed)
    lo = max(fmt.emin - fmt.mbits - 4, -149)
    hi = min(fmt.emax + 4, 127)
    e = torch.randint(lo, hi + 1, (n,), generator=g, dtype=torch.int32)
    mant = torch.randint(0, 1 << 23, (n,), generator=g, dtype=torch.int32)
    sign = torch.randint(0, 2, (n,), generator=g, dtype=torch.int32) << 31
    normal = e >= -126
    bits = torch.where(normal, ((e + 127) << 23) | mant, mant >> (-126 - e).clamp(0, 23)) | sign
    return bits.view(torch.float32)


# ---------------------------------------------------------------------------------------------
# Tier 3: Hypothesis strategies.


def grid_midpoints(fmt: F.FloatFormat) -> torch.Tensor:
    """The exact midpoints between consecutive non-negative finite values of fmt (the RNE ties)."""
    v = fmt.values[: fmt.max_code + 1]
    return ((v[1:] + v[:-1]) / 2).float()


_KINDS = ("gaussian", "ties", "below_pow2", "at_max", "zero", "fp32_subnormal", "element_subnormal", "one_hot")


@st.composite
def mx_block(draw, elem: F.FloatFormat, block_size: int = MX_BLOCK_SIZE) -> list[float]:
    """One block of values with planted structure, at a random magnitude."""
    kind = draw(st.sampled_from(_KINDS))
    e = draw(st.integers(-135, 100))
    seed = draw(st.integers(0, 2**32 - 1))
    g = torch.Generator().manual_seed(seed)
    scale = 2.0**e
    if kind == "gaussian":
        v = torch.randn(block_size, generator=g) * scale
    elif kind == "ties":
        mids = grid_midpoints(elem)
        idx = torch.randint(0, len(mids), (block_size,), generator=g)
        v = mids[idx] * scale
        v[0] = elem.max_normal * scale  # pins the FLOOR scale at 2^e so the midpoints are exact ties
    elif kind == "below_pow2":
        # amax one fp32 ulp below a power of two: the log2 pitfall
        v = torch.rand(block_size, generator=g) * scale
        v[0] = torch.nextafter(torch.tensor(2.0 ** min(e + 3, 127)), torch.tensor(0.0))
    elif kind == "at_max":
        v = (torch.rand(block_size, generator=g) * 2 - 1) * elem.max_normal * scale
        v[0] = elem.max_normal * scale
        v[1] = torch.nextafter(torch.tensor(elem.max_normal * scale), torch.tensor(float("inf")))
    elif kind == "zero":
        v = torch.zeros(block_size)
    elif kind == "fp32_subnormal":
        v = (torch.rand(block_size, generator=g) * 2 - 1) * 2.0**-127
    elif kind == "element_subnormal":
        v = (torch.rand(block_size, generator=g) * 2 - 1) * elem.min_normal * scale
        v[0] = elem.max_normal * scale
    else:  # one_hot
        v = torch.zeros(block_size)
        v[int(torch.randint(0, block_size, (1,), generator=g))] = scale
    v = torch.where(torch.rand(block_size, generator=g) < 0.5, -v, v)
    return torch.nan_to_num(v, nan=0.0, posinf=3e38, neginf=-3e38).tolist()


@st.composite
def mx_tensor(
    draw, elem: F.FloatFormat, max_blocks: int = 6, block_size: int = MX_BLOCK_SIZE, rows: int | None = None
) -> torch.Tensor:
    """[rows, nblocks * block_size] fp32 where every block has its own structure and magnitude."""
    rows = rows if rows is not None else draw(st.integers(1, 2))
    nblocks = draw(st.integers(1, max_blocks))
    blocks = [draw(mx_block(elem, block_size)) for _ in range(rows * nblocks)]
    return torch.tensor(blocks, dtype=torch.float32).reshape(rows, nblocks * block_size)


def fp32_values(min_magnitude_exp: int = -149, max_magnitude_exp: int = 127):
    return st.floats(width=32, allow_nan=False, allow_infinity=False,
                     min_value=-(2.0**max_magnitude_exp), max_value=2.0**max_magnitude_exp)
