"""NVIDIA ModelOpt's own NVFP4 and FP8 quantizers (what writes ModelOpt checkpoints) against the reference,
bit for bit: NVFP4 codes and block scales against the reference's MODELOPT variant given ModelOpt's
weight_scale_2 (the decode direction, amax / 2688); FP8 per-tensor codes and scale against quantize_fp8.
Each place where ModelOpt computes differently is asserted as such, with its cause."""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from harness.inputs.strategies import mx_tensor
from harness.peers.modelopt_adapter import (modelopt_available, modelopt_dequantize_nvfp4, modelopt_quantize_fp8,
                                            modelopt_quantize_nvfp4)
from reference.formats import E2M1, E4M3FN, decode
from reference.fp8 import Granularity, quantize_fp8
from reference.nvfp4 import NVFP4Variant, dequantize_nvfp4, nvfp4_global_encode_scale, quantize_nvfp4

ok, why = modelopt_available()
pytestmark = pytest.mark.skipif(not ok, reason=why)

# named corners: an all-zero block (ModelOpt stores 1.0), blocks far below the tensor's amax (their scale would
# round to 0 in E4M3: ModelOpt floors it at 2^-9), E2M1 ties, a block at the tensor amax
CORNERS = {
    "zero_block": [[0.0] * 16 + [6.0] + [1.0] * 15],
    "tiny_blocks": [[1e-6] * 16 + [3e-5] * 16 + [448.0 * 6] + [1.0] * 15],
    "e2m1_ties": [[6.0, 1.75, -0.25, -1.25, 0.75, 1.25, -5.0, 1.75, -2.5, 3.5, 1.25, -0.25, -0.75, -3.5, -1.25, 2.5]],
    "negative_max": [[-7.5] + [0.5] * 15],
}


def _check_nvfp4(x: torch.Tensor) -> None:
    codes, scales, decode_scale = modelopt_quantize_nvfp4(x)
    # ModelOpt's weight_scale_2 is fl(amax / 2688); the reference's own is 1 / fl(2688 / amax) (up to two ulps
    # apart): a checkpoint stores ModelOpt's, so it is the one given to the reference
    assert torch.equal(decode_scale, (x.abs().amax() / 2688.0).float())
    ref = quantize_nvfp4(x, global_decode_scale=decode_scale, variant=NVFP4Variant.MODELOPT)
    assert torch.equal(scales, ref.block_scales), (scales, ref.block_scales)
    # divergence: ModelOpt takes the sign from (x / block scale) < 0, so a negative x whose quotient is -0.0 (x is
    # -0.0, or so small that the fp32 division underflows) gets code 0 (+0) where the reference keeps the sign
    # (code 8, -0); both decode to zero. Every other code agrees.
    block = (decode(scales, E4M3FN) * decode_scale).repeat_interleave(16, -1)
    minus_zero = torch.signbit(x) & (x / block == 0)
    assert bool((codes[minus_zero] == 0).all()) and bool((ref.codes[minus_zero] == 8).all())
    assert torch.equal(codes[~minus_zero], ref.codes[~minus_zero]), (codes, ref.codes)


@pytest.mark.parametrize("name", list(CORNERS))
def test_modelopt_nvfp4_matches_the_modelopt_variant_on_named_corners(name):
    _check_nvfp4(torch.tensor(CORNERS[name], dtype=torch.float32))


@given(data=st.data())
def test_modelopt_nvfp4_matches_the_modelopt_variant(data):
    x = data.draw(mx_tensor(E2M1, block_size=16))
    if float(x.abs().amax()) < 2688 * 2.0**-126:  # the reference refuses a subnormal decode scale
        x = x + 1.0
    _check_nvfp4(x)


def test_modelopt_floors_tiny_block_scales_where_trtllm_stores_zero():
    """The variants differ exactly there: ModelOpt clamps a block scale below E4M3's smallest subnormal to 2^-9
    (0x01) before the cast, TensorRT-LLM's rounding stores 0x00 and zeroes the block."""
    x = torch.tensor(CORNERS["tiny_blocks"], dtype=torch.float32)
    _, scales, decode_scale = modelopt_quantize_nvfp4(x)
    trtllm = quantize_nvfp4(x, global_decode_scale=decode_scale, variant=NVFP4Variant.TRTLLM)
    assert scales[0, :2].tolist() == [0x01, 0x01] and trtllm.block_scales[0, :2].tolist() == [0x00, 0x00]


def test_the_reference_decode_scale_and_modelopts_differ_by_at_most_two_ulps():
    """Divergence by design: the reference derives s_dec = 1 / fl(2688 / amax) from the encode scale (two
    roundings), ModelOpt computes fl(amax / 2688) (one). They differ for about a third of amax values, by at most
    two fp32 ulps; a checkpoint's stored weight_scale_2 is given to the reference as is, so nothing downstream
    depends on it."""
    amax = torch.rand(4096, generator=torch.Generator().manual_seed(0)) * 100 + 1e-3
    theirs = (amax / 2688.0).float()
    ours = 1.0 / nvfp4_global_encode_scale(amax)
    ulps = (ours.view(torch.int32) - theirs.view(torch.int32)).abs()
    assert 0.2 < float((ulps > 0).float().mean()) < 0.5 and int(ulps.max()) <= 2


@given(data=st.data())
def test_modelopt_dequantize_rounds_twice_where_the_reference_rounds_once(data):
    """Divergence by design: ModelOpt dequantizes as fl(fl(stored * s_dec) * e2m1), the reference as the one
    rounding of the exact e2m1 * stored * s_dec. Where they differ ModelOpt's is that double rounding and the
    reference's is the correctly rounded product."""
    x = data.draw(mx_tensor(E2M1, block_size=16)) + 1.0
    codes, scales, s_dec = modelopt_quantize_nvfp4(x)
    theirs = modelopt_dequantize_nvfp4(codes, scales, s_dec)
    ours = dequantize_nvfp4(codes, scales, s_dec)
    e2m1 = decode(codes, E2M1)
    stored = decode(scales, E4M3FN).repeat_interleave(16, -1)
    assert torch.equal(theirs, (stored * s_dec) * e2m1)
    assert torch.equal(ours, (e2m1.double() * stored.double() * s_dec.double()).float())


@given(data=st.data())
def test_modelopt_fp8_per_tensor_matches_the_reference(data):
    """Codes bit for bit given ModelOpt's scale. The dynamic scales agree (amax / 448) except below the reference's
    floor 1 / (448 * 512) (vLLM's dynamic per-tensor quantizer keeps its scale there), which ModelOpt has not."""
    x = data.draw(mx_tensor(E4M3FN))
    assume(bool((x != 0).any()))  # an all-zero tensor: the next test
    codes, scale = modelopt_quantize_fp8(x)
    assert torch.equal(codes, quantize_fp8(x, E4M3FN, scale=scale.reshape(1, 1)).codes.view(torch.uint8))
    dynamic = quantize_fp8(x, E4M3FN, granularity=Granularity.PER_TENSOR).scale.reshape(())
    floor = torch.tensor(1.0 / (448.0 * 512.0))
    assert torch.equal(dynamic, scale.reshape(())) if scale >= floor else (torch.equal(dynamic, floor)
                                                                          and scale < dynamic)


def test_modelopt_fp8_of_an_all_zero_tensor_is_nan_where_the_reference_stores_zeros():
    """A defect of ModelOpt 0.47 the reference does not share: FP8QTensor.quantize of an all-zero tensor takes the
    scale amax / 448 = 0 and stores 0 / 0, every code 0xFF (NaN); the reference's scale floor 1 / (448 * 512) keeps
    the zeros zero."""
    x = torch.zeros(2, 32)
    codes, scale = modelopt_quantize_fp8(x)
    assert float(scale) == 0.0 and bool((codes == 0xFF).all())
    ref = quantize_fp8(x, E4M3FN, granularity=Granularity.PER_TENSOR)
    assert bool((ref.codes.view(torch.uint8) == 0).all()) and float(ref.scale.max()) > 0
