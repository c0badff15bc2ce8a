"""torchao's MX and NVFP4 quantizers against the reference, mode for mode (NUMERICS.md variants).

Agreement is bit for bit on finite inputs, including the planted corner cases; where torchao differs
by design the test says so explicitly."""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from harness.peers.torchao_adapter import (torchao_available, torchao_quantize_mx, torchao_quantize_nvfp4,
                                          torchao_triton_mx_casts)
from harness.platforms import has_gpu
from harness.inputs.strategies import mx_tensor
from reference.formats import E2M1
from reference.mx import MX_ELEMENT_FORMATS, ScaleMode, quantize_mx
from reference.nvfp4 import NVFP4Variant, quantize_nvfp4

ok, why = torchao_available()
pytestmark = pytest.mark.skipif(not ok, reason=why)

# torchao's quantizers are torch code: on a GPU the same code runs CUDA's arithmetic (division, log2, casts)
DEVICES = pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=pytest.mark.skipif(not has_gpu(), reason="no GPU here: torchao's CUDA path "
                                                                                "runs on the GPU machine"))])


@pytest.mark.parametrize("mode", list(ScaleMode), ids=lambda m: m.value)
@pytest.mark.parametrize("elem", MX_ELEMENT_FORMATS, ids=lambda f: f.name)
@DEVICES
@given(data=st.data())
def test_torchao_to_mx_matches_the_reference(elem, mode, device, data):
    x = data.draw(mx_tensor(elem))
    finite = torch.isfinite(x).all()
    assume(bool(finite))  # NaN/Inf blocks: see the next test
    codes, scales = torchao_quantize_mx(x, elem, mode, device)
    q = quantize_mx(x, elem, scale_mode=mode)
    same = scales == q.scales
    if mode is ScaleMode.RCEIL:
        assert bool((same | _rceil_log2_pitfall(x, elem, scales, q.scales)).all()), (scales, q.scales)
    else:
        assert torch.equal(scales, q.scales), (scales, q.scales)
    compared = (same & (q.scales != 0)).repeat_interleave(32, dim=-1)  # 0x00 blocks: the divergence test
    assert torch.equal(codes[compared], q.codes[compared])


def _rceil_log2_pitfall(x, elem, torchao_scales, ref_scales):
    """Divergence: torchao's RCEIL takes ceil(torch.log2(amax / max)) in fp32. Just above a power of two
    fp32's log2 rounds to the integer itself, so torchao picks the scale one binade low; the hardware
    rounding (cvt.rp to ue8m0, and the reference) rounds up. True where that explains the difference."""
    amax = x.abs().reshape(*x.shape[:-1], -1, 32).amax(-1)
    d = amax / elem.max_normal
    log2 = torch.log2(d)
    return (ref_scales.int() == torchao_scales.int() + 1) & (log2 == torch.floor(log2)) & (d != 2.0 ** log2)


@DEVICES
@pytest.mark.parametrize("elem", MX_ELEMENT_FORMATS, ids=lambda f: f.name)
def test_torchao_divergence_blocks_at_the_smallest_scale_use_2_pow_minus_126(elem, device):
    """Divergence by design: for a block whose E8M0 scale is 0x00 (2^-127), torchao stores 0x00 but
    divides by 2^-126 (it clamps the fp32 scale to the smallest normal), so its elements are those of
    the next scale up; the reference divides by the 2^-127 it stores."""
    from reference.mx import dequantize_mx

    x = torch.tensor([[1.5 * 2.0**-127, 4 * 2.0**-127, -0.5 * 2.0**-127] + [0.0] * 29])  # exact at 2^-127
    codes, scales = torchao_quantize_mx(x, elem, ScaleMode.FLOOR, device)
    q = quantize_mx(x, elem)
    assert scales.tolist() == q.scales.tolist() == [[0]]
    from reference.formats import encode

    as_2_pow_126 = encode(x, elem, exp_shift=-126)  # elements of x / 2^-126
    assert torch.equal(codes, as_2_pow_126) and not torch.equal(codes, q.codes)
    assert torch.equal(dequantize_mx(q.codes, q.scales, elem), x)  # the reference's bytes round-trip


@DEVICES
def test_torchao_marks_nan_blocks_with_the_nan_scale_like_the_reference(device):
    x = torch.ones(1, 64)
    x[0, 3] = float("nan")
    _, scales = torchao_quantize_mx(x, E2M1, ScaleMode.FLOOR, device)
    assert scales[0, 0] == 0xFF and scales[0, 1] == quantize_mx(x, E2M1).scales[0, 1]


# E2M1 midpoints of the all-ties block, tensor amax 6: torchao's reciprocal breaks them the other way
_TIES_BLOCK = [[6.0, 1.75, -0.25, -1.25, 0.75, 1.25, -5.0, 1.75, -2.5, 3.5, 1.25, -0.25, -0.75, -3.5, -1.25, 2.5]]
_E2M1_MIDPOINTS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=torch.float64)


def _nvfp4_pair(x: torch.Tensor, device: str):
    amax = x.abs().amax()
    s_dec = (amax / 2688.0).float()
    codes, scales = torchao_quantize_nvfp4(x, s_dec, device)
    return codes, scales, quantize_nvfp4(x, global_decode_scale=s_dec, variant=NVFP4Variant.TORCHAO), s_dec


@DEVICES
@given(data=st.data())
def test_torchao_nvfp4_matches_the_torchao_variant(device, data):
    x = torch.nan_to_num(data.draw(mx_tensor(E2M1, block_size=16))).clamp(-1e4, 1e4)
    assume(float(x.abs().amax()) > 1e-20)  # a tensor scale of amax / 2688 needs a nonzero amax
    codes, scales, q, s_dec = _nvfp4_pair(x, device)
    # torchao computes the block scale as fl(fl(amax_b / 6) / s_dec); the reference as
    # fl(fl(amax_b / 6) * fl(1 / s_dec)). The two can differ in the last bit before the E4M3 rounding,
    # so a block scale may differ by one code where it sits on an E4M3 rounding midpoint; elements then
    # differ in those blocks. Within blocks of equal scale torchao multiplies by fl(1 / (block scale *
    # s_dec)) where the reference divides, so an element exactly on an E2M1 midpoint may round the other
    # way: one code step apart, only there.
    differ = scales != q.block_scales
    assert bool(((scales.int() - q.block_scales.int()).abs() <= 1).all())
    same_blocks = ~differ.repeat_interleave(16, dim=-1)
    _assert_only_ties_differ(x, codes, q, s_dec, same_blocks)


def _assert_only_ties_differ(x, codes, q, s_dec, same_blocks):
    from reference.formats import E4M3FN, decode

    total = decode(q.block_scales, E4M3FN).double().repeat_interleave(16, dim=-1) * float(s_dec)
    scaled = (x.double() / total).abs()
    on_tie = ((scaled[..., None] - _E2M1_MIDPOINTS).abs() <= 2.0**-20 * scaled[..., None]).any(-1)
    off = same_blocks & (codes != q.codes)
    assert bool((on_tie | ~off).all()), f"codes differ off the E2M1 midpoints at {off.nonzero().tolist()}"
    step = (decode(codes, E2M1) - decode(q.codes, E2M1)).abs()
    assert bool((step[off] <= 1.0).all())  # adjacent codes (the widest E2M1 step is 1)


@DEVICES
def test_torchao_nvfp4_breaks_exact_ties_the_other_way_only_there(device):
    x = torch.tensor(_TIES_BLOCK)
    codes, scales, q, s_dec = _nvfp4_pair(x, device)
    assert torch.equal(scales, q.block_scales)
    assert not torch.equal(codes, q.codes)  # a real divergence, not noise: every element is a tie
    _assert_only_ties_differ(x, codes, q, s_dec, torch.ones_like(x, dtype=torch.bool))


@DEVICES
def test_torchao_nvfp4_without_a_tensor_scale_clamps_block_scales_at_2_pow_minus_6(device):
    x = torch.zeros(1, 32)
    x[0, 16:] = 1e-6  # a block whose scale underflows E4M3
    _, scales = torchao_quantize_nvfp4(x, None, device)
    assert scales.tolist() == [[0x08, 0x08]]  # 2^-6 both: the TORCHAO variant's zero and tiny blocks
    assert quantize_nvfp4(x, global_encode_scale=torch.tensor(1.0), variant=NVFP4Variant.TORCHAO).block_scales.tolist() == [[0x08, 0x08]]


@pytest.mark.parametrize("mode", list(ScaleMode), ids=lambda m: m.value)
@given(data=st.data())
def test_torchao_triton_mxfp8_cast_matches_the_reference(mode, data):
    """torchao's own Triton kernel (bf16 rows -> MXFP8), where torchao enables it (sm100+); on finite inputs
    the same bytes as the reference, with the RCEIL log2 pitfall allowed as for to_mx."""
    cast, reason = torchao_triton_mx_casts()
    if cast is None:
        pytest.skip(reason)
    from reference.formats import E4M3FN

    x = data.draw(mx_tensor(E4M3FN)).bfloat16().float()
    assume(bool(torch.isfinite(x).all()) and x.shape[-1] % 32 == 0)
    data8, scale = cast(x.bfloat16().cuda().contiguous(), 32, mode.value)
    codes = data8.view(torch.uint8).cpu().reshape(x.shape)
    scales = scale.view(torch.uint8).cpu().reshape(*x.shape[:-1], x.shape[-1] // 32)
    q = quantize_mx(x, E4M3FN, scale_mode=mode)
    same = scales == q.scales
    if mode is ScaleMode.RCEIL:
        assert bool((same | _rceil_log2_pitfall(x, E4M3FN, scales, q.scales)).all())
    else:
        assert torch.equal(scales, q.scales)
    compared = (same & (q.scales != 0)).repeat_interleave(32, dim=-1)
    assert torch.equal(codes[compared], q.codes[compared])
