"""Properties every reference quantizer must have, on inputs with planted structure (Hypothesis)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from harness.inputs.strategies import fp32_values, mx_tensor
from reference import formats as F
from reference.fp8 import FP8_FORMATS, Granularity, dequantize_fp8, qdq_fp8, quantize_fp8
from reference.mx import MX_ELEMENT_FORMATS, ScaleMode, dequantize_mx, mx_shared_exponent, qdq_mx, quantize_mx
from reference.nvfp4 import NVFP4_MIN_AMAX, NVFP4Variant, dequantize_nvfp4, qdq_nvfp4, quantize_nvfp4
from reference.packing import pack_fp4, unpack_fp4

ELEMS = pytest.mark.parametrize("elem", MX_ELEMENT_FORMATS, ids=lambda f: f.name)
MODES = pytest.mark.parametrize("mode", list(ScaleMode), ids=lambda m: m.value)


def every_mx_format_and_mode(test):
    """A property over every MX element format x scale mode, with Hypothesis drawing the data."""
    return ELEMS(MODES(given(data=st.data())(test)))


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal as bit patterns, treating every NaN as equal to every NaN."""
    nan = torch.isnan(a)
    return bool(torch.equal(nan, torch.isnan(b))) and torch.equal(
        a[~nan].float().view(torch.int32), b[~nan].float().view(torch.int32)
    )


# ---- MX ----------------------------------------------------------------------------------------


@every_mx_format_and_mode
def test_mx_dequantize_of_quantize_equals_qdq_bitwise(elem, mode, data):
    x = data.draw(mx_tensor(elem))
    q = quantize_mx(x, elem, scale_mode=mode)
    assert bitwise_equal(dequantize_mx(q.codes, q.scales, elem), qdq_mx(x, elem, scale_mode=mode))


@every_mx_format_and_mode
def test_mx_qdq_is_idempotent(elem, mode, data):
    x = data.draw(mx_tensor(elem))
    once = qdq_mx(x, elem, scale_mode=mode)
    finite = torch.isfinite(once)
    assert bitwise_equal(qdq_mx(torch.nan_to_num(once), elem, scale_mode=mode)[finite], once[finite])


@every_mx_format_and_mode
def test_mx_odd_symmetry(elem, mode, data):
    x = data.draw(mx_tensor(elem))
    assert bitwise_equal(qdq_mx(-x, elem, scale_mode=mode), -qdq_mx(x, elem, scale_mode=mode))


@ELEMS
@given(data=st.data())
def test_mx_error_within_half_a_step_where_not_saturated(elem, data):
    x = data.draw(mx_tensor(elem)).double()
    q = quantize_mx(x.float(), elem)
    shared = q.scales.double().sub(127).repeat_interleave(32, dim=-1)
    y = x.abs() / 2.0**shared
    in_range = y <= elem.max_normal
    e = torch.clamp(torch.floor(torch.log2(y.clamp_min(1e-300))), min=elem.emin)  # float64 log2: exact enough
    half_step = 2.0 ** (e - elem.mbits - 1) * 2.0**shared
    err = (qdq_mx(x.float(), elem).double() - x).abs()
    assert bool((err[in_range] <= half_step[in_range]).all())
    saturated = ~in_range
    assert bool((qdq_mx(x.float(), elem).double().abs()[saturated] == elem.max_normal * 2.0 ** shared[saturated]).all())


@ELEMS
@given(amax=fp32_values(max_magnitude_exp=120).map(abs).filter(lambda a: a > 0))
def test_mx_floor_exponent_is_the_frexp_exponent_minus_emax(elem, amax):
    exponent = mx_shared_exponent(torch.tensor([amax]), elem, ScaleMode.FLOOR).item()
    oracle = math.floor(math.log2(amax)) - elem.emax  # float64 log2 of an fp32 value: no pitfall
    assert exponent == max(-127, min(127, oracle))
    assert exponent == max(-127, math.frexp(amax)[1] - 1 - elem.emax)


@ELEMS
@given(data=st.data())
def test_mx_ceil_scale_is_at_least_floor_scale(elem, data):
    x = data.draw(mx_tensor(elem))
    floor = quantize_mx(x, elem, scale_mode=ScaleMode.FLOOR).scales.int()
    for mode in (ScaleMode.CEIL, ScaleMode.EVEN, ScaleMode.RCEIL):
        other = quantize_mx(x, elem, scale_mode=mode).scales.int()
        finite = floor != 0xFF
        assert bool((other[finite] >= floor[finite]).all()), mode
        assert bool((other[finite] <= floor[finite] + 1).all()), mode


@ELEMS
@given(data=st.data())
def test_mx_along_another_axis_is_the_transpose(elem, data):
    x = data.draw(mx_tensor(elem)).T.contiguous()
    q0 = quantize_mx(x, elem, axis=0)
    q1 = quantize_mx(x.T.contiguous(), elem, axis=-1)
    assert torch.equal(q0.codes.T, q1.codes) and torch.equal(q0.scales.T, q1.scales)


# ---- element encode ----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", [f for f in F.FORMATS.values() if f.signed], ids=lambda f: f.name)
@given(xs=st.lists(fp32_values(), min_size=2, max_size=64))
def test_encode_is_monotone(fmt, xs):
    x = torch.tensor(sorted(xs), dtype=torch.float32)
    v = F.decode(F.encode(x, fmt), fmt)
    assert bool((v[1:] >= v[:-1]).all())


@pytest.mark.parametrize("fmt", [f for f in F.FORMATS.values() if f.signed], ids=lambda f: f.name)
@given(xs=st.lists(fp32_values(), min_size=1, max_size=64))
def test_encode_decode_encode_is_a_fixed_point(fmt, xs):
    codes = F.encode(torch.tensor(xs, dtype=torch.float32), fmt)
    assert torch.equal(F.encode(F.decode(codes, fmt), fmt), codes)


@given(codes=st.lists(st.integers(0, 15), min_size=1, max_size=64).map(lambda c: c + c[:1] * (len(c) % 2)))
def test_fp4_pack_unpack_round_trip(codes):
    c = torch.tensor(codes, dtype=torch.uint8).reshape(1, -1)
    packed = pack_fp4(c)
    assert packed.shape[-1] == c.shape[-1] // 2
    assert torch.equal(unpack_fp4(packed), c)
    assert int(packed[0, 0]) == codes[0] | (codes[1] << 4)  # element 0 in the low nibble


# ---- NVFP4 -------------------------------------------------------------------------------------

VARIANTS = pytest.mark.parametrize("variant", list(NVFP4Variant), ids=lambda v: v.value)


def draw_nvfp4_input(data) -> torch.Tensor:
    x = torch.nan_to_num(data.draw(mx_tensor(F.E2M1, block_size=16))).clamp(-1e30, 1e30)
    amax = x.abs().amax().item()
    assume(amax == 0 or amax >= NVFP4_MIN_AMAX)  # below that no normal fp32 global scale exists (a clear error)
    return x


@VARIANTS
@given(data=st.data())
def test_nvfp4_dequantize_of_quantize_equals_qdq_bitwise(variant, data):
    x = draw_nvfp4_input(data)
    q = quantize_nvfp4(x, variant=variant)
    assert bitwise_equal(dequantize_nvfp4(q.codes, q.block_scales, q.global_decode_scale), qdq_nvfp4(x, variant=variant))


@VARIANTS
@given(data=st.data())
def test_nvfp4_odd_symmetry(variant, data):
    x = draw_nvfp4_input(data)
    assert bitwise_equal(qdq_nvfp4(-x, variant=variant), -qdq_nvfp4(x, variant=variant))


@given(data=st.data())
def test_nvfp4_both_global_scale_directions_agree(data):
    x = draw_nvfp4_input(data)
    s_enc = torch.tensor(2688.0) / x.abs().amax().clamp_min(1e-30)
    a = quantize_nvfp4(x, global_encode_scale=s_enc)
    b = quantize_nvfp4(x, global_decode_scale=a.global_decode_scale)
    # decode = fl(1/s_enc); 1/decode can differ from s_enc in the last bit, so block scales may differ
    # by at most one code and elements by at most one step; equal decode scales must give equal bytes.
    assert torch.equal(a.global_decode_scale, b.global_decode_scale)
    assert bool(((a.block_scales.int() - b.block_scales.int()).abs() <= 1).all())


# ---- FP8 ---------------------------------------------------------------------------------------

GRANULARITIES = [
    (Granularity.PER_TENSOR, None), (Granularity.PER_TOKEN, None), (Granularity.PER_BLOCK, (1, 32)),
    (Granularity.PER_BLOCK, (2, 32)),
]


@pytest.mark.parametrize("fmt", FP8_FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("gran", GRANULARITIES, ids=lambda g: f"{g[0].value}{g[1] or ''}")
@given(data=st.data())
def test_fp8_qdq_properties(fmt, gran, data):
    x = torch.nan_to_num(data.draw(mx_tensor(fmt, rows=2))).clamp(-1e30, 1e30)
    kw = dict(granularity=gran[0], block_shape=gran[1])
    once = qdq_fp8(x, fmt, **kw)
    if fmt.has_negative_zero:
        assert bitwise_equal(qdq_fp8(-x, fmt, **kw), -once)
    else:  # FNUZ has no -0: compare values
        assert torch.equal(qdq_fp8(-x, fmt, **kw), -once)
    q = quantize_fp8(x, fmt, **kw)
    # static quantization with the dynamic scale reproduces the dynamic result
    again = quantize_fp8(x, fmt, scale=q.scale, **kw)
    assert torch.equal(again.codes, q.codes)
    # error within half a step of the scaled grid; nothing exceeds max_value * scale
    d = dequantize_fp8(q.codes, q.scale, fmt).double()
    s = torch.broadcast_to(q.scale.double().repeat_interleave(x.shape[-2] // q.scale.shape[-2], -2)
                           .repeat_interleave(x.shape[-1] // q.scale.shape[-1], -1), x.shape)
    y = x.double().abs() / s
    e = torch.clamp(torch.floor(torch.log2(y.clamp_min(1e-300))), min=fmt.emin)
    half_step = 2.0 ** (e - fmt.mbits - 1) * s
    assert bool(((d - x.double()).abs() <= half_step * (1 + 1e-6) + 1e-300).all())
