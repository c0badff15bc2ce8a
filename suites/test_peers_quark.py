"""AMD Quark's own MX paths (what writes OCP MX checkpoints; vLLM's Quark MXFP4 path calls quark.torch.kernel.mx)
against the reference, bit for bit: the E8M0 scale and element codes of its pure-torch MX quantizer
(downcast_to_mxfp_torch: MXFP4, MXFP8 E4M3 / E5M2, scale modes ROUND_UP, ROUND_DOWN, EVEN), its dequantizer
(upcast_from_mxfp_torch), its EVEN shared-scale rule even_round for all five MX element formats, and its MX fake
quantizer fake_quantize_mx (FP4, FP6 E2M3 / E3M2; floor / ceil / even; a C++ extension JIT-built on first use, ~5 s)
against qdq_mx. Quark's modes map
to the reference's ScaleMode: EVEN -> EVEN, ROUND_UP -> RCEIL; ROUND_DOWN (floor(log2(amax / max_elem))) has no
reference mode and is checked against its own rule, with the elements against qdq_mx given Quark's exponent. Each
place where Quark computes differently is asserted as such, with its cause."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.inputs.strategies import mx_tensor
from harness.peers.quark_adapter import (QUARK_ELEMENT_FORMATS, QUARK_FAKE_ELEMENT_FORMATS, quark_available,
                                         quark_dequantize_mx, quark_even_exponent, quark_fake_quantize_mx,
                                         quark_qdq_mx, quark_quantize_mx)
from reference.formats import E2M1, E2M3, E3M2, E4M3FN, E5M2, Overflow, encode_finite, floor_log2
from reference.mx import ScaleMode, dequantize_mx, mx_shared_exponent, qdq_mx, quantize_mx

ok, why = quark_available()
pytestmark = pytest.mark.skipif(not ok, reason=why)

ALL_MX = (E2M1, E2M3, E3M2, E4M3FN, E5M2)
# Quark's mode -> the reference's, where one exists
REF_MODE = {"EVEN": ScaleMode.EVEN, "ROUND_UP": ScaleMode.RCEIL}
# (elem, mode) pairs Quark's torch path takes: EVEN is MXFP4 only (it raises NotImplementedError for FP8)
CASES = [(e, m) for e in QUARK_ELEMENT_FORMATS for m in ("ROUND_UP", "ROUND_DOWN", "EVEN") if m != "EVEN" or e is E2M1]
# E2M1 midpoints that round-to-nearest-even sends down (to the even code below); Quark sends every tie up
_E2M1_TIES_RNE_DOWN = (0.25, 1.25, 2.5, 5.0)


def _ids(case):
    return f"{case[0].name}-{case[1]}"


def _bits(t: torch.Tensor) -> torch.Tensor:
    """fp32 bit patterns, every NaN folded to one pattern."""
    return torch.where(torch.isnan(t), torch.full_like(t, float("nan")), t).view(torch.int32)


def _quotient(amax: torch.Tensor, elem) -> torch.Tensor:
    """fl(amax / max_elem): ROUND_UP and ROUND_DOWN divide (the reference's RCEIL multiplies by fl(1 / max))."""
    return amax.float() / elem.max_normal


def _round_up_codes(amax: torch.Tensor, elem) -> torch.Tensor:
    """ROUND_UP's E8M0 code: ceil(log2(fl(amax / max))), but never below 2^-126 for a nonzero quotient (its fp32
    round-up of a subnormal quotient lands on the smallest normal), 0 for a zero block, 0xFF for an Inf amax."""
    d = _quotient(amax, elem)
    not_pow2 = torch.frexp(d).mantissa != 0.5
    e = floor_log2(d) + (not_pow2 & (d > 0)).int()
    code = torch.where(d > 0, e.clamp_min(-126) + 127, 0)
    return torch.where(torch.isinf(d), 255, code).to(torch.uint8)


def _round_down_codes(amax: torch.Tensor, elem) -> torch.Tensor:
    """ROUND_DOWN's E8M0 code: the fp32 exponent field of fl(amax / max), i.e. floor(log2) + 127, and 0 (scale 0)
    for a quotient below 2^-126."""
    d = _quotient(amax, elem)
    return torch.where(d >= 2.0**-126, floor_log2(d) + 127, 0).to(torch.uint8)


def _even_overflow(amax: torch.Tensor, elem) -> torch.Tensor:
    """Where rounding amax to the element's mantissa carries past 2^128: even_round's fp32 carry gives Inf, whose
    log2 clamps to +127, while the reference's integer exponent gives 128 - emax."""
    return amax.float() >= (2.0 - 2.0 ** -(elem.mbits + 1)) * 2.0**127


def _blocks(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, 32)


def _expected_codes(x: torch.Tensor, elem, mode: str, scales: torch.Tensor) -> torch.Tensor:
    """The reference's element codes given Quark's scale codes (RNE, saturating), with Quark's two departures:
    MXFP4 ties where RNE goes down go up (round half away from zero: Quark adds one at the guard bit and drops the
    rest), and under ROUND_UP / ROUND_DOWN a scale code 0 multiplies by 0 (it takes the reciprocal of the scale
    only where the scale is nonzero as an fp32, and 0x00 reads as 0.0 there), leaving signed zeros."""
    xb = _blocks(x)
    s = scales.reshape(-1).to(torch.int32)
    shift = (s - 127)[:, None]
    ref = encode_finite(xb, elem, Overflow.SATURATE, exp_shift=shift)
    if elem is E2M1:
        mag = xb.abs().double() * torch.pow(2.0, -shift.double())
        tie = torch.zeros_like(xb, dtype=torch.bool)
        for t in _E2M1_TIES_RNE_DOWN:
            tie |= mag == t
        ref = ref + tie.to(torch.uint8)
    if mode != "EVEN":
        signed_zero = torch.where(torch.signbit(xb), elem.sign_bit, 0).to(torch.uint8)
        ref = torch.where((s == 0)[:, None], signed_zero, ref)
    return ref.reshape(x.shape)


def _check(x: torch.Tensor, elem, mode: str) -> None:
    codes, scales = quark_quantize_mx(x, elem, mode)
    amax = _blocks(x).abs().amax(-1).reshape(scales.shape)
    if mode == "ROUND_DOWN":
        assert torch.equal(scales, _round_down_codes(amax, elem)), (scales, _round_down_codes(amax, elem))
    else:
        ref = quantize_mx(x, elem, scale_mode=REF_MODE[mode])
        if mode == "ROUND_UP":
            assert torch.equal(scales, _round_up_codes(amax, elem))
            # divergence: a quotient fl(amax / max) at or below 2^-127 (and not 0): Quark 2^-126 (code 1), the
            # reference's RCEIL its ceil, clamped to 2^-127 (code 0). Everywhere else RCEIL, bit for bit.
            tiny = (_quotient(amax, elem) > 0) & (_quotient(amax, elem) <= 2.0**-127)
            assert bool((scales[tiny] == 1).all()) and bool((ref.scales[tiny] == 0).all())
        else:
            # divergence: an amax whose mantissa rounding carries past 2^128 (>= 3.19e38 for E2M1)
            over = _even_overflow(amax, elem)
            assert bool((scales[over] == 254).all())
            tiny = torch.zeros_like(over)
        same = ~(tiny | (_even_overflow(amax, elem) if mode == "EVEN" else tiny))
        assert torch.equal(scales[same], ref.scales[same]), (scales, ref.scales)
    assert torch.equal(codes, _expected_codes(x, elem, mode, scales)), (codes, _expected_codes(x, elem, mode, scales))
    if elem is E2M1 and mode in REF_MODE:
        # where the scales agree and no E2M1 tie is rounded down by RNE, the codes are the reference's
        no_tie = torch.equal(_expected_codes(x, elem, "EVEN", scales),
                             encode_finite(_blocks(x), elem, Overflow.SATURATE,
                                           exp_shift=(scales.reshape(-1, 1).int() - 127)).reshape(x.shape))
        if no_tie and torch.equal(scales, ref.scales) and (mode == "EVEN" or bool((scales > 0).all())):
            assert torch.equal(codes, ref.codes)


@pytest.mark.parametrize("case", CASES, ids=_ids)
@settings(max_examples=25)
@given(data=st.data())
def test_quark_quantize_mx_matches_the_reference_given_each_mode(case, data):
    elem, mode = case
    _check(data.draw(mx_tensor(elem, max_blocks=4)), elem, mode)


@pytest.mark.parametrize("elem", QUARK_ELEMENT_FORMATS, ids=lambda e: e.name)
@settings(max_examples=25)
@given(data=st.data())
def test_quark_dequantize_mx_matches_the_reference(elem, data):
    """upcast_from_mxfp_torch on the reference's layout: element value * 2^(scale - 127) bit for bit, except scale
    code 0x00, which Quark reads as 0.0 (the code shifted into an fp32 exponent field) rather than 2^-127."""
    x = data.draw(mx_tensor(elem, max_blocks=4))
    ref = quantize_mx(x, elem, scale_mode=data.draw(st.sampled_from(list(ScaleMode))))
    got = quark_dequantize_mx(ref.codes, ref.scales, elem)
    want = dequantize_mx(ref.codes, ref.scales, elem)
    zero_scale = (ref.scales == 0).repeat_interleave(32, -1)
    assert bool((got[zero_scale] == 0).all())
    assert torch.equal(_bits(got[~zero_scale]), _bits(want[~zero_scale]))


@pytest.mark.parametrize("elem", ALL_MX, ids=lambda e: e.name)
@settings(max_examples=40)
@given(amax=st.floats(width=32, min_value=0.0, max_value=3.4028234663852886e38, allow_subnormal=True))
def test_quark_even_round_is_the_reference_even_scale(elem, amax):
    """even_round (Quark's default, scale_calculation_mode="even") for all five element formats, FP6 included:
    the reference's EVEN exponent, except where rounding amax carries past 2^128 (Quark: +127)."""
    a = torch.tensor([amax], dtype=torch.float32)
    got = quark_even_exponent(a, elem)
    want = mx_shared_exponent(a, elem, ScaleMode.EVEN)
    if bool(_even_overflow(a, elem)):
        assert int(got) == 127 and int(want) == 128 - elem.emax
    else:
        assert torch.equal(got, want), (amax, got, want)


@pytest.mark.parametrize("elem", ALL_MX, ids=lambda e: e.name)
def test_quark_even_round_named_amaxes(elem):
    top = torch.nextafter(torch.tensor((2.0 - 2.0 ** -(elem.mbits + 1)) * 2.0**127), torch.tensor(0.0))
    a = torch.tensor([0.0, 1e-45, 2.0**-126, 1.0, 2.0, elem.max_normal, (2.0 - 2.0 ** -(elem.mbits + 1)),
                      torch.nextafter(torch.tensor(2.0), torch.tensor(0.0)).item(), float(top)])
    assert torch.equal(quark_even_exponent(a, elem), mx_shared_exponent(a, elem, ScaleMode.EVEN))


def test_round_up_is_rceil_over_a_whole_binade():
    """ROUND_UP divides (fl(amax / max)), the reference's RCEIL multiplies by fl(1 / max) (the hardware recipe):
    the quotients differ for over half the amaxes of a binade, their ceil-exponents never (all 2^23 mantissas, for
    the E2M1, E4M3 and E5M2 maxima; a power-of-two shift carries it to every binade whose quotient is normal)."""
    a = (torch.arange(1 << 23, dtype=torch.int32) | 0x3F800000).view(torch.float32)
    for elem in QUARK_ELEMENT_FORMATS:
        rceil = mx_shared_exponent(a, elem, ScaleMode.RCEIL).add(127).to(torch.uint8)
        assert torch.equal(_round_up_codes(a, elem), rceil)


def _block(vals, fill=0.0):
    v = list(vals) + [fill] * (32 - len(vals))
    return torch.tensor([v], dtype=torch.float32)


CORNERS = {
    "all_zero": _block([]),
    "signed_zeros": _block([-0.0, 0.0] * 16),
    "amax_pow2": _block([4.0, 1.0, -3.0, 0.3, 0.5]),
    "amax_below_pow2": _block([float(torch.nextafter(torch.tensor(8.0), torch.tensor(0.0))), 1.0]),
    "e2m1_midpoints": _block([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0,
                              -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5.0]),
    "element_subnormals": _block([448.0, 0.1, -0.2, 1e-3, 2.0**-9, 2.0**-10, 3 * 2.0**-11, 2.0**-16, -2.0**-17]),
    "wide_in_block": _block([6.0, 1e-30, -1e-38, 1e-45]),
    "largest_scale": _block([3.0e38, -1.0e38, 2.0**127]),
    "top_binade": _block([3.4e38, 2.0**100]),
    "smallest_scale": _block([1e-40, 3e-45, 2e-39]),
    "small_normal_amax": _block([2.0**-120, -2.0**-125]),
}


@pytest.mark.parametrize("name", list(CORNERS))
@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_quark_named_corners(case, name):
    _check(CORNERS[name], *case)


def test_quark_named_corners_store_what_the_arithmetic_says():
    """E2M1 midpoints all round up in magnitude (0.25 -> 0.5, 1.25 -> 1.5, 2.5 -> 3, 5 -> 6; RNE: 0, 1, 2, 4); an amax
    of 3e38 takes E8M0 254 under EVEN (reference 253) and both dequantize 3e38 to Inf (4 * 2^126 and 2 * 2^127 both
    overflow fp32); a tiny block takes code 1 under ROUND_UP (reference RCEIL 0) and 0 under ROUND_DOWN with every
    element a signed zero."""
    codes, scales = quark_quantize_mx(CORNERS["e2m1_midpoints"], E2M1, "EVEN")
    ref = quantize_mx(CORNERS["e2m1_midpoints"], E2M1, scale_mode=ScaleMode.EVEN)
    assert int(scales) == int(ref.scales) == 127
    assert codes[0, :8].tolist() == [7, 1, 2, 3, 4, 5, 6, 7] and ref.codes[0, :8].tolist() == [7, 0, 2, 2, 4, 4, 6, 6]
    assert codes[0, 8:15].tolist() == [9, 10, 11, 12, 13, 14, 15]
    codes, scales = quark_quantize_mx(CORNERS["largest_scale"], E2M1, "EVEN")
    ref = quantize_mx(CORNERS["largest_scale"], E2M1, scale_mode=ScaleMode.EVEN)
    assert int(scales) == 254 and int(ref.scales) == 253
    assert torch.isinf(quark_dequantize_mx(codes, scales, E2M1)[0, 0]) and torch.isinf(dequantize_mx(*ref, E2M1)[0, 0])
    _, scales = quark_quantize_mx(CORNERS["smallest_scale"], E4M3FN, "ROUND_UP")
    rceil = quantize_mx(CORNERS["smallest_scale"], E4M3FN, scale_mode=ScaleMode.RCEIL)
    assert int(scales) == 1 and int(rceil.scales) == 0
    codes, scales = quark_quantize_mx(CORNERS["smallest_scale"], E2M1, "ROUND_DOWN")
    assert int(scales) == 0 and bool((codes == 0).all())


NONFINITE = {"nan": _block([float("nan"), 1.0, -2.0]), "inf": _block([float("inf"), 1.0, -2.0]),
             "minus_inf": _block([float("-inf"), 1.0, 2.0])}


@pytest.mark.parametrize("name", list(NONFINITE))
@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_quark_nonfinite_blocks(case, name):
    """The reference stores 0xFF for a block holding NaN or Inf and dequantizes it to NaN. Quark:
    EVEN: NaN -> 0xFF (even_round keeps NaN), Inf -> 254 (log2(Inf) clamps to +127);
    ROUND_UP: Inf -> 0xFF, NaN -> 0x00 (NaN's bits + 0x7FFFFF wrap past the sign and mask to exponent 0);
    ROUND_DOWN: Inf -> 0xFF, NaN -> the NaN's exponent field, 0xFF.
    Element codes are whatever x * (1 / scale) gives: the finite ones become signed zeros when the reciprocal is
    0 (scale Inf) or the scale reads as 0.0; an Inf times 0 is NaN (E2M1: saturated to 6, sign from the NaN).
    Dequantized with Quark's own upcast (0xFF read as +Inf, 0x00 as 0.0) a NaN block under ROUND_UP comes back all
    zero (the NaN lost) and a non-finite block under EVEN comes back with Inf where the reference has NaN."""
    elem, mode = case
    x = NONFINITE[name]
    codes, scales = quark_quantize_mx(x, elem, mode)
    ref = quantize_mx(x, elem, scale_mode=REF_MODE.get(mode, ScaleMode.FLOOR))
    assert int(ref.scales) == 0xFF and torch.isnan(dequantize_mx(*ref, elem)).all()
    want_scale = {("EVEN", "nan"): 255, ("ROUND_UP", "nan"): 0}.get((mode, name), 254 if mode == "EVEN" else 255)
    assert int(scales) == want_scale
    back = quark_dequantize_mx(codes, scales, elem)
    if mode == "ROUND_UP" and name == "nan" and elem is E2M1:
        assert bool((back == 0).all())  # the NaN block silently becomes zeros
    elif mode == "EVEN":
        assert bool(torch.isinf(back[0, 0])) and not bool(torch.isnan(back).all())
    # the NaN/Inf itself never dequantizes to a finite value
    assert not bool(torch.isfinite(back[0, 0])) or (mode == "ROUND_UP" and name == "nan")


@pytest.mark.parametrize("scale_code,expect", [(0x00, 0.0), (0xFF, float("inf")), (1, 2.0**-126), (254, 2.0**127)])
def test_quark_dequantize_reads_e8m0_as_an_fp32_exponent_field(scale_code, expect):
    """upcast multiplies by the scale code shifted into an fp32 exponent: 0x00 is 0.0 (E8M0: 2^-127) and 0xFF is
    +Inf (E8M0: NaN), so with 0xFF a zero element gives NaN and a nonzero one +-Inf (reference: all NaN)."""
    codes = torch.zeros(1, 32, dtype=torch.uint8)
    codes[0, 0] = 2  # E2M1 1.0
    got = quark_dequantize_mx(codes, torch.tensor([[scale_code]], dtype=torch.uint8), E2M1)
    assert float(got[0, 0]) == expect
    want = dequantize_mx(codes, torch.tensor([[scale_code]], dtype=torch.uint8), E2M1)
    if scale_code == 0xFF:
        assert bool(torch.isnan(got[0, 1:]).all()) and bool(torch.isnan(want).all())


@pytest.mark.parametrize("elem", QUARK_ELEMENT_FORMATS, ids=lambda e: e.name)
@settings(max_examples=15)
@given(data=st.data())
def test_quark_round_down_elements_are_qdq_mx_given_its_exponent(elem, data):
    """ROUND_DOWN (no reference mode) can leave amax above max_elem * scale: its elements saturate exactly as the
    reference's do given that exponent (qdq_mx with shared_exponent), E2M1 ties aside."""
    x = data.draw(mx_tensor(elem, max_blocks=4))
    _, scales = quark_quantize_mx(x, elem, "ROUND_DOWN")
    got = quark_qdq_mx(x, elem, "ROUND_DOWN")
    want = qdq_mx(x, elem, shared_exponent=scales.int() - 127)
    keep = (scales > 0).repeat_interleave(32, -1)
    if elem is E2M1:
        mag = x.abs().double() * torch.pow(2.0, 127 - scales.double()).repeat_interleave(32, -1)
        for t in _E2M1_TIES_RNE_DOWN:
            keep &= mag != t
    assert torch.equal(_bits(got[keep]), _bits(want[keep]))
    assert bool((got[~(scales > 0).repeat_interleave(32, -1)] == 0).all())


# ---- fake_quantize_mx (the compiled CPU kernel): QDQ values against qdq_mx ----

FAKE_MODE = {"floor": ScaleMode.FLOOR, "ceil": ScaleMode.CEIL, "even": ScaleMode.EVEN}
FAKE_CASES = [(e, m) for e in QUARK_FAKE_ELEMENT_FORMATS for m in FAKE_MODE]


def _fake_exponent(amax: torch.Tensor, elem, mode: str) -> torch.Tensor:
    """The exponent fake_quantize_mx scales by: floor / ceil of the fp32 torch.log2(amax) (which rounds to an
    integer within about 2^-24 * |log2| of one: an amax just below 2^k takes FLOOR k, one just above takes CEIL k),
    minus emax, never clamped to E8M0's [-127, 127]; even: even_round (clamped). int64, -inf-free for amax > 0."""
    if mode == "even":
        return quark_even_exponent(amax, elem).long()
    lg = torch.log2(amax.float())
    e = torch.floor(lg) if mode == "floor" else torch.ceil(lg)
    return (e - elem.emax).long()


def _check_fake(x: torch.Tensor, elem, mode: str) -> None:
    got = quark_fake_quantize_mx(x, elem, mode)
    amax = x.reshape(-1, 32).abs().amax(-1)
    e = _fake_exponent(amax, elem, mode)
    # blocks whose exponent E8M0 can hold: qdq_mx given that exponent, except that a value rounding to zero is +0
    # (Quark's kernel drops the sign of zero; the reference keeps -0)
    fits = (amax > 0) & (e >= -127) & (e <= 127)
    want = qdq_mx(x, elem, shared_exponent=e.clamp(-127, 127).int().reshape(-1, 1).reshape(*x.shape[:-1], -1))
    want = torch.where(want == 0, 0.0, want)
    mask = fits.repeat_interleave(32).reshape(x.shape)
    assert torch.equal(_bits(got[mask]), _bits(want[mask]))
    # all-zero blocks stay zero (+0: Quark replaces a zero scale by eps and 0 / eps = 0)
    zero = (amax == 0).repeat_interleave(32).reshape(x.shape)
    assert bool((got[zero] == 0).all()) and not bool(torch.signbit(got[zero]).any())
    # divergence: floor / ceil scales below 2^-127 (amax < 2^(emax - 127)) are used as they are (fp32 subnormal
    # powers of two, or eps = 2^-23 below 2^-149) where the reference clamps to E8M0's 2^-127
    assert bool((amax[(e < -127) & (amax > 0)] < 2.0 ** (elem.emax - 126)).all())
    # divergences from the reference's own mode: the log2 rounding (floor / ceil), even_round's overflow (even)
    ref_e = mx_shared_exponent(amax, elem, FAKE_MODE[mode])
    differs = fits & (e != ref_e)
    if mode == "floor":
        assert bool((e[differs] == ref_e[differs] + 1).all())  # log2 rounded up to the next integer
        assert bool((torch.log2(amax[differs]) == torch.floor(torch.log2(amax[differs]))).all())
    elif mode == "ceil":
        assert bool((e[differs] == ref_e[differs] - 1).all())  # log2 rounded down onto an integer
    else:
        assert bool(_even_overflow(amax[differs], elem).all())


@pytest.mark.parametrize("case", FAKE_CASES, ids=_ids)
@settings(max_examples=20)
@given(data=st.data())
def test_quark_fake_quantize_mx_is_qdq_mx_given_its_exponent(case, data):
    elem, mode = case
    _check_fake(data.draw(mx_tensor(elem, max_blocks=4)), elem, mode)


@pytest.mark.parametrize("name", list(CORNERS))
@pytest.mark.parametrize("case", FAKE_CASES, ids=_ids)
def test_quark_fake_quantize_mx_named_corners(case, name):
    _check_fake(CORNERS[name], *case)


def test_quark_fake_quantize_mx_corners_by_value():
    """floor: amax 8 - 2^-21 (just below 2^3): torch.log2 gives 3.0, so scale 2 where the reference's FLOOR takes 1
    and saturates (E2M1: Quark 8, reference 6); ties to even like the reference (0.25 -> 0, 1.25 -> 1, 2.5 -> 2,
    5 -> 4), unlike downcast_to_mxfp_torch; -0.25 -> +0 (reference -0); ceil: amax 2^20 (1 + 2^-23): log2 rounds
    to 20.0, so scale 2^18 where the reference's CEIL takes 2^19 (no saturation: 6 * 2^18 > amax), and 0.375 * 2^20
    keeps 1.5 * 2^18 where the reference rounds 0.75 * 2^19 to 2^19."""
    got = quark_fake_quantize_mx(CORNERS["amax_below_pow2"], E2M1, "floor")
    assert float(got[0, 0]) == 8.0 and float(qdq_mx(CORNERS["amax_below_pow2"], E2M1)[0, 0]) == 6.0
    got = quark_fake_quantize_mx(CORNERS["e2m1_midpoints"], E2M1, "even")
    assert got[0, :9].tolist() == [6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 0.0] and not bool(torch.signbit(got[0, 8]))
    a = float(torch.nextafter(torch.tensor(2.0**20), torch.tensor(float("inf"))))
    x = _block([a, 0.375 * 2.0**20])
    got, want = quark_fake_quantize_mx(x, E2M1, "ceil"), qdq_mx(x, E2M1, scale_mode=ScaleMode.CEIL)
    assert got[0, :2].tolist() == [2.0**20, 1.5 * 2.0**18] and want[0, :2].tolist() == [2.0**20, 2.0**19]


@pytest.mark.parametrize("name", list(NONFINITE))
@pytest.mark.parametrize("case", FAKE_CASES, ids=_ids)
def test_quark_fake_quantize_mx_nonfinite_blocks(case, name):
    """NaN anywhere makes the block NaN, as in the reference. An Inf block: floor / ceil scale by 2^Inf, so every
    value is NaN (Inf / Inf) or 0 times Inf: NaN, as the reference; even clamps log2(Inf) to 2^127, so the Inf stays
    +-Inf and the other values flush to 0 (reference: the whole block NaN)."""
    elem, mode = case
    x = NONFINITE[name]
    got = quark_fake_quantize_mx(x, elem, mode)
    if name == "nan" or mode != "even":
        assert bool(torch.isnan(got).all())
    else:
        assert bool(torch.isinf(got[0, 0])) and bool((got[0, 1:] == 0).all())


def test_a_build_lock_left_by_a_killed_run_does_not_stall_the_next(tmp_path):
    """torch's extension builder locks with a file; a run killed mid-build leaves it, and every later load used to
    poll for it forever (two CI runs stalled so, 300 s a test). A copy of the built extension folder with such a
    lock planted loads in a fresh process, gives the same values, and the lock is gone."""
    import shutil
    import subprocess
    import sys

    from harness.peers.quark_adapter import quark_extensions_dir

    x = CORNERS["e2m1_midpoints"]
    want = quark_fake_quantize_mx(x, E2M1, "even")  # builds the extension in the real folder, if it is not yet
    built = quark_extensions_dir()
    copy = tmp_path / built.relative_to(built.parents[2])
    shutil.copytree(built, copy, ignore=shutil.ignore_patterns(".harness-lock", "lock"))
    stale = [d / "lock" for d in copy.iterdir() if d.is_dir()]
    assert stale, f"no extension folder under {built}"
    for lock in stale:
        lock.touch()
    torch.save(x, tmp_path / "x.pt")
    script = ("import sys, torch; from harness.peers.quark_adapter import quark_fake_quantize_mx; "
              "from reference.formats import E2M1; "
              "torch.save(quark_fake_quantize_mx(torch.load(sys.argv[1]), E2M1, 'even'), sys.argv[2])")
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    env.pop("TORCH_EXTENSIONS_DIR", None)
    try:
        run = subprocess.run([sys.executable, "-c", script, str(tmp_path / "x.pt"), str(tmp_path / "got.pt")],
                             env=env, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"loading Quark's extension with a stale torch build lock ({stale[0]}) stalled past "
                             f"{e.timeout} s") from None
    assert run.returncode == 0, run.stderr[-3000:]
    assert torch.equal(_bits(torch.load(tmp_path / "got.pt")), _bits(want))
    assert not any(lock.exists() for lock in stale)
