"""OCP Microscaling (MX v1.0): blocks of 32 elements along one axis sharing one E8M0 scale.

quantize_mx returns the logical layout: one uint8 element code per element (unpacked, x's shape) and
one uint8 E8M0 scale code per block (x's shape with the block axis divided by the block size). Packing
FP4 codes two per byte is reference.packing; swizzled scale layouts belong to the backends.

The shared exponent is a software choice (the hardware takes any E8M0), so it is a parameter:
  FLOOR  floor(log2 amax) - emax_elem                      OCP MX v1.0 section 6.3 sample algorithm
  CEIL   ceil(log2 amax) - emax_elem                        never saturates an element
  EVEN   floor(log2(amax rounded to the element's mbits)) - emax_elem    torchao's EVEN mode
  RCEIL  ceil(log2(fl(amax * fl(1/max_elem))))               NVIDIA cuBLAS/cuDNN/TRT-LLM (cvt.rp to ue8m0)
Every log2 is taken from the fp32 exponent bits: floor(torch.log2(x)) is wrong for x just below a
power of two (log2(7.9999995f) rounds to 3.0 and picks a scale one binade too high).
The shared exponent is clamped to [-127, 127]; an all-zero block gets scale 0x00 and zero elements;
a block holding NaN or Inf gets scale 0xFF (NaN), its element codes are 0, and it dequantizes to NaN
(torchao stores 0xFF; microxcaling makes every element NaN: the same values after dequantization).
"""

from __future__ import annotations

import enum
from typing import NamedTuple

import torch

from .formats import E2M1, E2M3, E3M2, E4M3FN, E5M2, E8M0, FloatFormat, Overflow, check_codes, check_float_input
from .formats import check_int, check_output_dtype, decode, encode_finite, exp2_int, floor_log2, ldexp_exact
from .formats import round_to_format_grid

__all__ = [
    "ScaleMode",
    "MX_ELEMENT_FORMATS",
    "MX_BLOCK_SIZE",
    "MXQuantized",
    "mx_shared_exponent",
    "quantize_mx",
    "dequantize_mx",
    "qdq_mx",
]

MX_BLOCK_SIZE = 32
MX_ELEMENT_FORMATS: tuple[FloatFormat, ...] = (E2M1, E2M3, E3M2, E4M3FN, E5M2)
_E8M0_NAN = E8M0.nan_code
_SCALE_EXP_MIN, _SCALE_EXP_MAX = -127, 127


class ScaleMode(enum.Enum):
    FLOOR = "floor"
    CEIL = "ceil"
    EVEN = "even"
    RCEIL = "rceil"


class MXQuantized(NamedTuple):
    codes: torch.Tensor  # uint8 element codes, x's shape
    scales: torch.Tensor  # uint8 E8M0 codes, x's shape with the block axis divided by block_size


def _check_elem(elem: FloatFormat) -> None:
    if elem not in MX_ELEMENT_FORMATS:
        names = [f.name for f in MX_ELEMENT_FORMATS]
        raise ValueError(f"elem must be an MX element format {names}, got {elem!r}")


def _blocked(x: torch.Tensor, axis: int, block_size: int, arg: str = "x") -> torch.Tensor:
    """Move `axis` last and split it into [..., nblocks, block_size]."""
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    check_int(axis, "axis")
    if x.dim() == 0:
        raise ValueError(f"{arg} must have at least one dimension")
    if not -x.dim() <= axis < x.dim():
        raise ValueError(f"axis={axis} is out of range for {arg} of shape {tuple(x.shape)}")
    n = x.shape[axis]
    if n % block_size:
        raise ValueError(
            f"{arg}.shape[{axis}] = {n} is not divisible by block_size {block_size}; pad the tensor or choose "
            "another axis"
        )
    xt = x.movedim(axis, -1)
    return xt.reshape(*xt.shape[:-1], n // block_size, block_size)


def _unblocked(xb: torch.Tensor, axis: int) -> torch.Tensor:
    return xb.flatten(-2).movedim(-1, axis)


def mx_shared_exponent(amax: torch.Tensor, elem: FloatFormat, scale_mode: ScaleMode) -> torch.Tensor:
    """The unbiased E8M0 exponent (int32, clamped to [-127, 127]) for blocks with the given amax >= 0
    (finite). The scale is 2^exponent; elements are x / 2^exponent."""
    amax = amax.float()
    e = floor_log2(amax)
    if scale_mode is ScaleMode.FLOOR:
        shared = e - elem.emax
    elif scale_mode is ScaleMode.CEIL:
        not_pow2 = torch.frexp(amax).mantissa != 0.5
        shared = e + (not_pow2 & (amax > 0)).int() - elem.emax
    elif scale_mode is ScaleMode.EVEN:
        # Round amax to the element's mantissa width; a carry into the next binade bumps the exponent.
        # (The tie 2 - 2^-(m+1) rounds up under both RNE and torchao's add-half-and-truncate.)
        frac = ldexp_exact(amax, -e.clamp_min(-149))  # in [1, 2) for amax > 0
        carry = torch.round(frac * (1 << elem.mbits)) >= (1 << (elem.mbits + 1))
        shared = e + carry.int() - elem.emax
    elif scale_mode is ScaleMode.RCEIL:
        inv_max = torch.tensor(1.0 / elem.max_normal, dtype=torch.float32)  # fl(1/max), as the hardware recipe
        d = amax * inv_max
        not_pow2 = torch.frexp(d).mantissa != 0.5
        shared = floor_log2(d) + (not_pow2 & (d > 0)).int()
    else:
        raise ValueError(f"scale_mode must be a ScaleMode, got {scale_mode!r}")
    return torch.clamp(shared, _SCALE_EXP_MIN, _SCALE_EXP_MAX).to(torch.int32)


# Blocks are processed in chunks of about 2^18 elements: temporaries then stay in cache and out of the
# allocator's mmap path (each fresh 64 MB temporary costs page faults), which makes the reference
# several times faster on CPU without changing a bit of the result.
_CHUNK_ELEMENTS = 1 << 18


def _chunks(nblocks: int, block_size: int):
    step = max(1, _CHUNK_ELEMENTS // block_size)
    for start in range(0, nblocks, step):
        yield slice(start, min(start + step, nblocks))


def _block_stats(xb: torch.Tensor, elem: FloatFormat, scale_mode: ScaleMode, flush_fp32_subnormals: bool):
    """For blocks [n, bs]: the fp32 values (zeroed in non-finite blocks), the shared exponents [n] and
    the non-finite mask [n]."""
    xf = xb.float()
    if flush_fp32_subnormals:
        xf = torch.where(xf.abs() < torch.finfo(torch.float32).tiny, torch.zeros_like(xf), xf)
    amax = xf.abs().amax(dim=-1)
    nonfinite = ~torch.isfinite(amax)  # NaN or Inf anywhere in the block
    if bool(nonfinite.any()):
        amax = torch.where(nonfinite, 0.0, amax)
        xf = torch.where(nonfinite[..., None], 0.0, xf)
    return xf, mx_shared_exponent(amax, elem, scale_mode), nonfinite


def quantize_mx(
    x: torch.Tensor,
    elem: FloatFormat,
    *,
    axis: int = -1,
    block_size: int = MX_BLOCK_SIZE,
    scale_mode: ScaleMode = ScaleMode.FLOOR,
    flush_fp32_subnormals: bool = False,
) -> MXQuantized:
    """Quantize x to MX: element codes (x's shape, uint8) and E8M0 scale codes (uint8)."""
    check_float_input(x)
    _check_elem(elem)
    xb = _blocked(x, axis, block_size)
    flat = xb.reshape(-1, block_size)
    codes = torch.empty(flat.shape, dtype=torch.uint8)
    scales = torch.empty(flat.shape[0], dtype=torch.uint8)
    for sl in _chunks(flat.shape[0], block_size):
        xf, shared, nonfinite = _block_stats(flat[sl], elem, scale_mode, flush_fp32_subnormals)
        codes[sl] = encode_finite(xf, elem, Overflow.SATURATE, exp_shift=shared[:, None])
        scales[sl] = torch.where(nonfinite, _E8M0_NAN, shared + E8M0.bias).to(torch.uint8)
    return MXQuantized(_unblocked(codes.view(xb.shape), axis), scales.view(xb.shape[:-1]).movedim(-1, axis))


def dequantize_mx(
    codes: torch.Tensor,
    scales: torch.Tensor,
    elem: FloatFormat,
    *,
    axis: int = -1,
    block_size: int = MX_BLOCK_SIZE,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """element value * 2^(scale - 127); scale 0xFF gives NaN for the whole block."""
    check_output_dtype(dtype)
    _check_elem(elem)
    check_codes(codes, elem)
    check_codes(scales, E8M0, "scales")
    cb = _blocked(codes, axis, block_size, "codes")
    want = list(codes.shape)
    want[axis] //= block_size
    if tuple(scales.shape) != tuple(want):
        raise ValueError(
            f"scales must have shape {tuple(want)} for codes of shape {tuple(codes.shape)} "
            f"(block {block_size} along axis {axis}), got {tuple(scales.shape)}"
        )
    s = scales.movedim(axis, -1).to(torch.int32)
    v = ldexp_exact(decode(cb, elem), (s - E8M0.bias)[..., None])
    v = torch.where((s == _E8M0_NAN)[..., None], torch.nan, v)
    return _unblocked(v, axis).to(dtype)


def qdq_mx(
    x: torch.Tensor,
    elem: FloatFormat,
    *,
    dtype: torch.dtype = torch.float32,
    shared_exponent: torch.Tensor | None = None,
    axis: int = -1,
    block_size: int = MX_BLOCK_SIZE,
    scale_mode: ScaleMode = ScaleMode.FLOOR,
    flush_fp32_subnormals: bool = False,
) -> torch.Tensor:
    """Quantize-dequantize in one pass, computed as values (never through codes or the value table):
    a second derivation that must agree bit for bit with dequantize_mx(quantize_mx(x)).

    shared_exponent (int, the scales' shape) fixes each block's exponent instead of deriving it from the
    block: what a bound needs to ask "what would this block give under the neighbouring scale?"."""
    check_output_dtype(dtype)
    check_float_input(x)
    _check_elem(elem)
    xb = _blocked(x, axis, block_size)
    flat = xb.reshape(-1, block_size)
    fixed = None
    if shared_exponent is not None:
        if not isinstance(shared_exponent, torch.Tensor) or shared_exponent.is_floating_point() or \
                shared_exponent.is_complex() or shared_exponent.dtype == torch.bool:
            raise TypeError(f"shared_exponent must be an integer tensor (exponents of 2), got "
                            f"{getattr(shared_exponent, 'dtype', type(shared_exponent).__name__)}")
        if shared_exponent.dim() != x.dim() or tuple(shared_exponent.movedim(axis, -1).shape) != tuple(xb.shape[:-1]):
            raise ValueError(f"shared_exponent must have the scales' shape, got {tuple(shared_exponent.shape)}")
        if shared_exponent.numel() and (int(shared_exponent.min()) < _SCALE_EXP_MIN
                                        or int(shared_exponent.max()) > _SCALE_EXP_MAX):
            raise ValueError(f"shared_exponent must lie in [{_SCALE_EXP_MIN}, {_SCALE_EXP_MAX}] (E8M0's range), got "
                             f"values in [{int(shared_exponent.min())}, {int(shared_exponent.max())}]")
        fixed = shared_exponent.movedim(axis, -1).reshape(-1).to(torch.int32).clamp(_SCALE_EXP_MIN, _SCALE_EXP_MAX)
    out = torch.empty(flat.shape, dtype=torch.float32)
    for sl in _chunks(flat.shape[0], block_size):
        xf, shared, nonfinite = _block_stats(flat[sl], elem, scale_mode, flush_fp32_subnormals)
        if fixed is not None:
            shared = fixed[sl]
        shift = shared[:, None]
        rounded, _ = round_to_format_grid(xf.abs() * ldexp_exact(torch.ones(()), -shift), elem)
        rounded.clamp_max_(elem.max_normal)  # OCP MX elements saturate
        v = torch.copysign(ldexp_exact(rounded, shift), xf)
        out[sl] = torch.where(nonfinite[:, None], torch.nan, v)
    return _unblocked(out.view(xb.shape), axis).to(dtype)
