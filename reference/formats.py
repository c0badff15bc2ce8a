"""Element formats as data, and exact encode/decode between fp32 and integer codes.

A format is (ebits, mbits, bias, signedness, subnormals, special-value policy); every derived fact
(value table, max normal, emax, tie points) is computed from those fields, so a new element format is
one record. Sources: OCP Microscaling Formats (MX) v1.0 section 5 (E2M1, E2M3, E3M2, E4M3, E5M2, E8M0),
OCP 8-bit Floating Point v1.0 (E4M3FN, E5M2), and the FNUZ variants as implemented by MI300 hardware.

Encoding never uses torch's float8 casts: their overflow behaviour changed between torch 2.11 (NaN)
and 2.13 (saturate). Everything here is integer and exact power-of-two arithmetic, so the result is
the same on every torch version and device.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass

import torch

__all__ = [
    "true_divide",
    "Specials",
    "Overflow",
    "FloatFormat",
    "E2M1",
    "E2M3",
    "E3M2",
    "E4M3FN",
    "E4M3FNUZ",
    "E5M2",
    "E5M2FNUZ",
    "E8M0",
    "FORMATS",
    "format_by_name",
    "floor_log2",
    "exp2_int",
    "ldexp_exact",
    "round_to_format_grid",
    "encode",
    "encode_finite",
    "decode",
    "check_float_input",
    "check_codes",
]


class Specials(enum.Enum):
    """Which codes are not finite numbers."""

    NONE = "all codes finite"  # FP4/FP6: no Inf, no NaN
    IEEE = "Inf at exponent all-ones and mantissa 0, NaN at exponent all-ones otherwise"  # E5M2
    FN = "NaN at S.1111.111 only, no Inf"  # E4M3FN ("finite")
    FNUZ = "NaN at 0x80 only (the -0 pattern), no Inf, no -0"  # MI300 FP8
    UNSIGNED_NAN_ALL_ONES = "unsigned; NaN at all-ones"  # E8M0 scale


class Overflow(enum.Enum):
    """What encode does with a finite value that rounds above the largest finite code."""

    SATURATE = "saturate"  # clamp to +-max normal, sign kept (OCP MX elements, satfinite); Inf -> +-max
    NONFINITE = "nonfinite"  # Inf where the format has it, else NaN (ml_dtypes / IEEE behaviour)


@dataclass(frozen=True)
class FloatFormat:
    name: str
    ebits: int
    mbits: int
    bias: int
    specials: Specials
    signed: bool = True
    subnormals: bool = True

    # ---- sizes -------------------------------------------------------------------------------
    @property
    def nbits(self) -> int:
        return int(self.signed) + self.ebits + self.mbits

    @property
    def ncodes(self) -> int:
        return 1 << self.nbits

    @property
    def sign_bit(self) -> int:
        return (1 << (self.ebits + self.mbits)) if self.signed else 0

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number (and of the subnormal quantum's binade)."""
        return 1 - self.bias if self.subnormals else -self.bias

    # ---- value table, derived from the fields (float64, NaN where a code is NaN) -----------
    @functools.cached_property
    def values(self) -> torch.Tensor:
        codes = torch.arange(self.ncodes, dtype=torch.int64, device="cpu")  # a cached table: never a default device's
        mag = codes & ((1 << (self.ebits + self.mbits)) - 1)
        e_field = mag >> self.mbits
        mant = mag & ((1 << self.mbits) - 1)
        e_all_ones = (1 << self.ebits) - 1
        if self.subnormals:
            # Subnormals (e_field 0) share the exponent of the smallest normal: 0.m * 2^emin.
            unit = torch.where(e_field == 0, mant, mant + (1 << self.mbits)).double()
            exp = torch.clamp(e_field, min=1) - self.bias - self.mbits
        else:
            unit = (mant + (1 << self.mbits)).double()
            exp = e_field - self.bias - self.mbits
        v = unit * torch.pow(2.0, exp.double())
        if self.signed:
            v = torch.where((codes & self.sign_bit) != 0, -v, v)
        nan = torch.zeros_like(codes, dtype=torch.bool)
        if self.specials is Specials.IEEE:
            top = e_field == e_all_ones
            v = torch.where(top & (mant == 0), torch.copysign(torch.tensor(torch.inf, dtype=torch.float64, device="cpu"), v), v)
            nan = top & (mant != 0)
        elif self.specials is Specials.FN:
            nan = (e_field == e_all_ones) & (mant == (1 << self.mbits) - 1)
        elif self.specials is Specials.FNUZ:
            nan = codes == self.sign_bit
        elif self.specials is Specials.UNSIGNED_NAN_ALL_ONES:
            nan = codes == self.ncodes - 1
        v = torch.where(nan, torch.tensor(torch.nan, dtype=torch.float64, device="cpu"), v)
        v.requires_grad_(False)
        return v

    @functools.cached_property
    def values_fp32(self) -> torch.Tensor:
        # Every value of every format here is exactly representable in fp32 (E8M0's 2^-127 as a
        # subnormal), so this table is exact.
        return self.values.float()

    @functools.cached_property
    def max_code(self) -> int:
        """Largest positive finite code (= its magnitude bits)."""
        pos = self.values[: (self.sign_bit or self.ncodes)]
        finite = torch.isfinite(pos)
        return int(torch.nonzero(finite).max())

    @property
    def max_normal(self) -> float:
        return float(self.values[self.max_code])

    @property
    def emax(self) -> int:
        """floor(log2(max normal)): the OCP MX 'emax_elem' used to place the shared exponent."""
        return int(torch.frexp(torch.tensor(self.max_normal, dtype=torch.float64)).exponent) - 1

    @property
    def min_normal(self) -> float:
        return 2.0**self.emin

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (self.emin - self.mbits) if self.subnormals else 2.0**self.emin

    @property
    def has_inf(self) -> bool:
        return self.specials is Specials.IEEE

    @property
    def has_nan(self) -> bool:
        return self.specials is not Specials.NONE

    @property
    def has_negative_zero(self) -> bool:
        return self.signed and self.specials is not Specials.FNUZ

    @property
    def nan_code(self) -> int | None:
        """The canonical NaN code (positive where a sign exists)."""
        return {
            Specials.NONE: None,
            Specials.IEEE: ((1 << self.ebits) - 1) << self.mbits | ((1 << self.mbits) - 1),
            Specials.FN: ((1 << self.ebits) - 1) << self.mbits | ((1 << self.mbits) - 1),
            Specials.FNUZ: self.sign_bit,
            Specials.UNSIGNED_NAN_ALL_ONES: self.ncodes - 1,
        }[self.specials]

    @property
    def inf_code(self) -> int | None:
        return ((1 << self.ebits) - 1) << self.mbits if self.has_inf else None

    def __repr__(self) -> str:
        return f"FloatFormat({self.name})"


E2M1 = FloatFormat("e2m1", ebits=2, mbits=1, bias=1, specials=Specials.NONE)
E2M3 = FloatFormat("e2m3", ebits=2, mbits=3, bias=1, specials=Specials.NONE)
E3M2 = FloatFormat("e3m2", ebits=3, mbits=2, bias=3, specials=Specials.NONE)
E4M3FN = FloatFormat("e4m3fn", ebits=4, mbits=3, bias=7, specials=Specials.FN)
E4M3FNUZ = FloatFormat("e4m3fnuz", ebits=4, mbits=3, bias=8, specials=Specials.FNUZ)
E5M2 = FloatFormat("e5m2", ebits=5, mbits=2, bias=15, specials=Specials.IEEE)
E5M2FNUZ = FloatFormat("e5m2fnuz", ebits=5, mbits=2, bias=16, specials=Specials.FNUZ)
E8M0 = FloatFormat(
    "e8m0", ebits=8, mbits=0, bias=127, specials=Specials.UNSIGNED_NAN_ALL_ONES, signed=False, subnormals=False
)

FORMATS: dict[str, FloatFormat] = {f.name: f for f in (E2M1, E2M3, E3M2, E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ, E8M0)}


def format_by_name(name: str) -> FloatFormat:
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown element format {name!r}; expected one of {sorted(FORMATS)}") from None


# ---- input checks shared by every reference entry point --------------------------------------

_FLOAT_INPUTS = (torch.float32, torch.bfloat16, torch.float16)


OUTPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_output_dtype(dtype, arg: str = "dtype") -> None:
    """A dequantizer's output dtype: a real float type (an integer or FP8 dtype would silently truncate or
    re-quantize the values)."""
    if dtype not in OUTPUT_DTYPES:
        raise TypeError(f"{arg} must be one of {[str(d) for d in OUTPUT_DTYPES]}, got {dtype!r}")


def check_float_input(x: torch.Tensor, arg: str = "x") -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{arg} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _FLOAT_INPUTS:
        raise TypeError(f"{arg} must be float32, bfloat16 or float16, got {x.dtype}")
    check_has_data(x, arg)


def check_has_data(x: torch.Tensor, arg: str) -> None:
    if x.is_meta:
        raise ValueError(f"{arg} is on the meta device (a shape without data); give it real values")


def check_int(value, arg: str, minimum: int | None = None) -> int:
    """A Python int (not a bool, not a float that happens to be whole), at least `minimum`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{arg} must be an int, got {value!r} ({type(value).__name__})")
    if minimum is not None and value < minimum:
        raise ValueError(f"{arg} must be an int >= {minimum}, got {value}")
    return value


def check_codes(codes: torch.Tensor, fmt: FloatFormat, arg: str = "codes") -> None:
    if not isinstance(codes, torch.Tensor):
        raise TypeError(f"{arg} must be a torch.Tensor, got {type(codes).__name__}")
    check_has_data(codes, arg)
    if codes.dtype != torch.uint8:
        raise TypeError(f"{arg} must be uint8 {fmt.name} codes (one code per byte), got {codes.dtype}")
    if fmt.nbits < 8 and codes.numel() and int(codes.max()) >= fmt.ncodes:
        bad = int(codes.max())
        raise ValueError(f"{arg} holds {bad:#x}, out of range for {fmt.name} ({fmt.nbits}-bit codes < {fmt.ncodes:#x})")


# ---- exact power-of-two helpers ---------------------------------------------------------------


def floor_log2(x: torch.Tensor) -> torch.Tensor:
    """floor(log2|x|) as int32, exact, from frexp (never torch.log2: log2(7.9999995f) rounds to 3.0).

    Defined for finite nonzero x, fp32 subnormals included; zero gives -150 (below every fp32 value).
    """
    e = torch.frexp(x.float()).exponent.to(torch.int32) - 1
    return torch.where(x == 0, torch.full_like(e, -150), e)


def exp2_int(e: torch.Tensor) -> torch.Tensor:
    """2**e as fp32 for integer e in [-126, 127], built from the exponent bits (exact)."""
    return ((e.to(torch.int32) + 127) << 23).view(torch.float32)


def true_divide(a: torch.Tensor, b) -> torch.Tensor:
    """fl(a / b), correctly rounded on every device. PyTorch's CUDA division by a CPU scalar (a Python number or a
    0-dim CPU tensor) multiplies by fl(1 / b) instead, which is an ulp off fl(a / b) for some a: FP8 scales
    amax / 448 and NVFP4's amax / 6 then differ between a reference run on the CPU and one on a GPU (seen on the
    H200: results/gpu-issue24/run-10). The divisor goes to a's device as a tensor, where division is IEEE's."""
    if isinstance(b, torch.Tensor) and b.device == a.device:
        return a / b
    return a / torch.as_tensor(b, dtype=a.dtype if a.is_floating_point() else None, device=a.device)


def ldexp_exact(x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """x * 2**k in fp32 for |k| <= 252, in two exact steps so that neither power of two leaves the
    normal range. Exact whenever the true result is an fp32 normal (or zero)."""
    k = k.to(torch.int32)
    k1 = torch.div(k, 2, rounding_mode="floor")
    return x * exp2_int(k1) * exp2_int(k - k1)


def _exp_field(e: torch.Tensor | int) -> torch.Tensor | int:
    """fp32 exponent bits (already shifted into place) of 2^e, for integer e in [-126, 127]."""
    return (e + 127) << 23


def round_to_format_grid(y: torch.Tensor, fmt: FloatFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """Round y >= 0 (fp32, finite or +Inf) to fmt's grid, round-half-to-even, unbounded above.

    Returns (rounded, code_magnitude). The quantum of y's binade is 2^(E - mbits), E = max(floor(log2 y),
    emin); adding and subtracting C = 2^(E - mbits + 23) makes the fp32 adder round y to a multiple of that
    quantum, half-to-even (C's ulp is the quantum). The magnitude code is (E - emin) * 2^mbits + y/quantum:
    exponent field and mantissa together, a carry into the next binade included. Values above fmt's range
    come back above fmt.max_code; the caller decides saturation.
    """
    m, emin = fmt.mbits, fmt.emin
    e_bits = (y.view(torch.int32) & 0x7F800000).clamp_(_exp_field(emin), _exp_field(fmt.emax + 1))
    c = (e_bits + ((23 - m) << 23)).view(torch.float32)
    rounded = (y + c).sub_(c)
    # Clip before the integer conversion so that huge or infinite inputs keep the arithmetic in range.
    clipped = torch.clamp_max(rounded, float(2.0 ** (fmt.emax + 2)))
    inv_quantum = (((m + 254) - (e_bits >> 23)) << 23).view(torch.float32)  # 2^(mbits - E)
    n = clipped.mul_(inv_quantum).to(torch.int32)
    code_mag = ((e_bits >> 23) - (127 + emin)).mul_(1 << m).add_(n)
    return rounded, code_mag


def encode(
    x: torch.Tensor,
    fmt: FloatFormat,
    overflow: Overflow = Overflow.SATURATE,
    exp_shift: torch.Tensor | int = 0,
) -> torch.Tensor:
    """Encode x * 2^-exp_shift as `fmt` codes (uint8), round-half-to-even.

    exp_shift is an int or an int tensor broadcastable to x (MX passes one shared exponent per block);
    x * 2^-exp_shift must not need more than fp32's exponent range to be exact where it matters: any
    result below fp32's normal range is far below half of fmt's smallest subnormal and rounds to 0.
    NaN goes to the format's NaN; a format without NaN (FP4, FP6) rejects NaN input. Inf goes to the
    format's Inf (NONFINITE) or to +-max (SATURATE). -0 keeps its sign where the format has -0.
    E8M0 is unsigned: x must be positive (zero and negatives are rejected).
    """
    check_float_input(x)
    if not isinstance(overflow, Overflow):
        raise TypeError(f"overflow must be an Overflow, got {overflow!r}")
    xf = x.float()
    nan_in = torch.isnan(xf)
    has_nan = bool(nan_in.any())
    if has_nan and not fmt.has_nan:
        raise ValueError(f"x contains NaN but {fmt.name} has no NaN encoding")
    if overflow is Overflow.NONFINITE and not fmt.has_nan:
        raise ValueError(f"overflow=NONFINITE needs a format with Inf or NaN; {fmt.name} has neither")
    if not fmt.signed:
        if bool((xf <= 0).any()):
            raise ValueError(f"x must be positive to encode as unsigned {fmt.name}")
        return _encode_unsigned_pow2(xf, fmt, overflow, exp_shift, nan_in)

    if has_nan:
        xf = torch.where(nan_in, 0.0, xf)
    code = encode_finite(xf, fmt, overflow, exp_shift)
    if has_nan:
        code = torch.where(nan_in, fmt.nan_code, code.to(torch.int32))
    return code.to(torch.uint8)


def encode_finite(
    xf: torch.Tensor, fmt: FloatFormat, overflow: Overflow = Overflow.SATURATE, exp_shift: torch.Tensor | int = 0
) -> torch.Tensor:
    """encode() for fp32 x without NaN (Inf allowed) and a signed fmt, with no input checks: the hot path
    that quantizers call after they have validated and screened their input."""
    bits = xf.view(torch.int32)
    y = (bits & 0x7FFFFFFF).view(torch.float32)
    if not (isinstance(exp_shift, int) and exp_shift == 0):
        y = y * ldexp_exact(torch.ones(()), -torch.as_tensor(exp_shift, dtype=torch.int32))
    _, code_mag = round_to_format_grid(y, fmt)
    if overflow is Overflow.SATURATE:
        code_mag.clamp_max_(fmt.max_code)
    else:
        over_code = fmt.inf_code if fmt.has_inf else fmt.nan_code
        code_mag = torch.where(code_mag > fmt.max_code, over_code, code_mag)
    sign = (bits >> 31) & fmt.sign_bit  # arithmetic shift: all ones for negative x
    if fmt.specials is Specials.FNUZ:
        sign = sign * (code_mag != 0)  # FNUZ has no -0: that pattern is its NaN
    return (code_mag | sign).to(torch.uint8)


def _encode_unsigned_pow2(xf, fmt: FloatFormat, overflow: Overflow, exp_shift, nan_in) -> torch.Tensor:
    # E8M0 is a power of two 2^(code - bias) with no zero and no subnormals. Between 2^E and 2^(E+1) the
    # tie is 1.5 * 2^E, which rounds up (the even one of the integers 1 and 2). Below 2^-127 the nearest
    # value is 2^-127 (code 0).
    e = floor_log2(torch.where(nan_in | torch.isinf(xf), 1.0, xf)) - torch.as_tensor(exp_shift, dtype=torch.int32)
    frac = ldexp_exact(xf.abs(), -floor_log2(xf))  # in [1, 2)
    code = e + fmt.bias + (frac >= 1.5).int()
    over = (code > fmt.max_code) | torch.isinf(xf)
    code = code.clamp_min(0)
    code = torch.where(over, fmt.max_code if overflow is Overflow.SATURATE else fmt.nan_code, code)
    code = torch.where(nan_in, fmt.nan_code, code)
    return code.to(torch.uint8)


def decode(codes: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """fmt codes (uint8) -> fp32 values, by table lookup (the table is derived from the fields), on the
    codes' device."""
    check_codes(codes, fmt)
    return fmt.values_fp32.to(codes.device)[codes.long()]
