"""compressed-tensors' own NVFP4 and FP8 paths (what writes llm-compressor checkpoints and what vLLM's loader reads)
against the reference, bit for bit: NVFP4 codes, block scales and the encode-direction weight_global_scale against
the reference's COMPRESSED_TENSORS variant given that global scale; FP8 per-tensor, per-channel and 128x128-block
codes and scales against quantize_fp8; both dequantizations against the reference's. Each place where
compressed-tensors computes differently is asserted as such, with its cause."""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from harness.inputs.strategies import mx_tensor
from harness.peers.compressed_tensors_adapter import (compressed_tensors_available, ct_dequantize_fp8,
                                                      ct_dequantize_nvfp4, ct_quantize_fp8, ct_quantize_nvfp4)
from reference.formats import E2M1, E4M3FN, decode
from reference.fp8 import Granularity, dequantize_fp8, quantize_fp8
from reference.nvfp4 import (NVFP4_MIN_AMAX, NVFP4Variant, dequantize_nvfp4, nvfp4_global_encode_scale,
                             quantize_nvfp4)
from reference.quantizers import nvfp4_decode_scale

ok, why = compressed_tensors_available()
pytestmark = pytest.mark.skipif(not ok, reason=why)

CT = NVFP4Variant.COMPRESSED_TENSORS
_D_TRT = float(torch.tensor(448.0) * (1.0 / nvfp4_global_encode_scale(0.7)))  # fl(448 fl(1 / s_enc)), amax 0.7

# named corners (one weight [N, K]): 0x20 is E4M3's 0.125, what compressed-tensors stores for a scale of 0
CORNERS = {
    "all_zero_tensor": [[0.0] * 32, [0.0] * 32],
    # an all-zero block in a nonzero tensor: its scale rounds to 0 and is stored as 0.125
    "zero_block": [[0.0] * 16 + [6.0] + [1.0] * 15],
    # fl(1e-6 / 6) * 448 and fl(3e-5 / 6) * 1 are below 2^-10 (half E4M3's smallest subnormal): scale 0 -> 0.125
    "tiny_block_below_e4m3": [[1e-6] * 16 + [6.0] + [1.0] * 15, [3e-5] * 16 + [2688.0] + [0.5] * 15],
    # tensor amax 6: s_enc = 448, block scale 448 (0x7E), divisor 448 / 448 = 1, so every element is an E2M1 tie
    "e2m1_midpoints": [[6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5.0, 4.5]],
    # tensor amax 2688 = 448 * 6: s_enc = 1, a block at the amax stores 448 (0x7E) and divides by 448
    "block_max_at_448x6": [[2688.0, -2688.0, 1344.0, 672.0, 448.0, 224.0, 1.0, -3.0] * 2 + [100.0] * 16],
    # -0.0 in a normal block, and -1e-30 whose quotient underflows to -0.0 (s_enc = 2.688e-27, divisor 4.65e25)
    "negative_zero": [[-0.0] * 8 + [-1.0, 1.0, -0.0, 0.5] * 6, [-1e-30] * 16 + [1e30] + [-0.0] * 15],
}


def _minus_zero_quotients(x: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """Where x is negative and x / fl(stored / s_enc) is -0.0 (x is -0.0, or the fp32 division underflows)."""
    divisor = (decode(scales, E4M3FN) / global_scale).repeat_interleave(16, -1)
    return torch.signbit(x) & (x / divisor == 0)


def _check_nvfp4(x: torch.Tensor) -> None:
    codes, scales, global_scale = ct_quantize_nvfp4(x)
    # generate_gparam is fl(2688 / amax), 1.0 for an all-zero tensor: the reference's encode scale bit for bit
    assert torch.equal(global_scale, nvfp4_global_encode_scale(x.abs().amax()).reshape(1))
    ref = quantize_nvfp4(x, global_encode_scale=global_scale, variant=CT)
    assert torch.equal(scales, ref.block_scales), (scales, ref.block_scales)
    # divergence: compressed-tensors' cast_to_fp4 takes the sign from torch.sign(quotient), which is 0 for -0.0, so a
    # negative x whose quotient is -0.0 gets code 0 (+0) where the reference keeps the sign (code 8, -0); a negative
    # quotient that rounds to zero from below keeps its sign (sign -1 times 0). Every other code agrees.
    minus_zero = _minus_zero_quotients(x, scales, global_scale)
    assert bool((codes[minus_zero] == 0).all()) and bool((ref.codes[minus_zero] == 8).all())
    assert torch.equal(codes[~minus_zero], ref.codes[~minus_zero]), (codes, ref.codes)


@pytest.mark.parametrize("name", list(CORNERS))
def test_ct_nvfp4_matches_the_compressed_tensors_variant_on_named_corners(name):
    _check_nvfp4(torch.tensor(CORNERS[name], dtype=torch.float32))


def test_ct_nvfp4_named_corners_store_what_the_arithmetic_says():
    """The corners' bytes: zero and tiny blocks store 0x20 with zero codes; a block at 448 * 6 stores 0x7E (the
    next, amax 100, fl(100 / 6) = 16.67 -> 16, 0x58) and divides by 448 (-3 / 448 rounds to -0, code 8); the
    midpoints go to the even code (-0.25 to -0, code 8); -0.0 inputs, and quotients that underflow to -0.0, become
    code 0."""
    def run(name):
        return ct_quantize_nvfp4(torch.tensor(CORNERS[name], dtype=torch.float32))

    codes, scales, gs = run("all_zero_tensor")
    assert float(gs) == 1.0 and bool((scales == 0x20).all()) and bool((codes == 0).all())
    codes, scales, _ = run("tiny_block_below_e4m3")
    assert scales[:, 0].tolist() == [0x20, 0x20] and bool((codes[:, :16] == 0).all())
    codes, scales, gs = run("block_max_at_448x6")
    assert float(gs) == 1.0 and scales.tolist() == [[0x7E, 0x58]]
    assert codes[0, :8].tolist() == [7, 15, 5, 3, 2, 1, 0, 8]
    codes, scales, _ = run("e2m1_midpoints")
    assert scales.tolist() == [[0x7E]] and codes[0].tolist() == [7, 0, 2, 2, 4, 4, 6, 6, 8, 10, 10, 12, 12, 14, 14, 6]
    codes, _, _ = run("negative_zero")
    assert codes[0, :8].tolist() == [0] * 8 and codes[1, :16].tolist() == [0] * 16


def _nvfp4_input(data) -> torch.Tensor:
    x = data.draw(mx_tensor(E2M1, block_size=16))
    amax = float(x.abs().amax())
    assume(amax == 0 or amax >= NVFP4_MIN_AMAX)  # below it: the next test
    return x


@given(data=st.data())
def test_ct_nvfp4_matches_the_compressed_tensors_variant(data):
    _check_nvfp4(_nvfp4_input(data))


def test_ct_global_scale_of_a_tiny_tensor_is_one_where_the_reference_refuses():
    """Divergence by design: generate_gparam replaces a non-finite 2688 / amax (amax below 2688 / FLT_MAX, about
    7.9e-36) by 1.0, which flushes the whole tensor to zero codes under 0.125 block scales; just above that it
    stores an s_enc beyond 2^126 (a subnormal decode scale). The reference refuses any amax below NVFP4_MIN_AMAX
    (3.2e-35) with a ValueError rather than flush silently."""
    x = torch.full((1, 16), 1e-36)
    codes, scales, gs = ct_quantize_nvfp4(x)
    assert float(gs) == 1.0 and bool((scales == 0x20).all()) and bool((codes == 0).all())
    _, _, gs = ct_quantize_nvfp4(torch.full((1, 16), 1e-35))
    assert float(gs) > 2.0**126
    for amax in (1e-36, 1e-35):
        with pytest.raises(ValueError, match="too small for NVFP4"):
            nvfp4_global_encode_scale(torch.tensor(amax))


def test_ct_divides_by_stored_over_s_enc_which_is_why_it_is_a_variant():
    """Why COMPRESSED_TENSORS is not TRTLLM with a 0x20 rule: compressed-tensors divides elements by
    fl(stored / s_enc), TRTLLM by fl(stored * fl(1 / s_enc)). For amax 0.7 they differ by one ulp (TRTLLM's is
    larger), so x = 0.25 * TRTLLM's divisor is an exact tie (code 0) for TRTLLM and just above it (code 1, 0.5)
    for compressed-tensors; the CT variant reproduces compressed-tensors."""
    x = torch.tensor([[0.7, 0.25 * _D_TRT, -0.25 * _D_TRT] + [0.0] * 13], dtype=torch.float32)
    codes, scales, gs = ct_quantize_nvfp4(x)
    assert float(torch.tensor(448.0) / gs) < _D_TRT and scales.tolist() == [[0x7E]]
    trtllm = quantize_nvfp4(x, global_encode_scale=gs, variant=NVFP4Variant.TRTLLM)
    assert codes[0, 1:3].tolist() == [1, 9] and trtllm.codes[0, 1:3].tolist() == [0, 8]
    assert torch.equal(codes, quantize_nvfp4(x, global_encode_scale=gs, variant=CT).codes)


@given(data=st.data())
def test_ct_dequantize_rounds_twice_where_the_reference_rounds_once(data):
    """Divergence by design: compressed-tensors dequantizes as fl(e2m1 * fl(stored / s_enc)), the reference (with
    the checkpoint's decode scale s_dec = fl(1 / s_enc)) as the one rounding of e2m1 * stored * s_dec. Both are
    those formulas exactly; where fl(stored / s_enc) and the result are normal fp32 they are within 3 roundings,
    2^-22 relative, of each other (a subnormal divisor, stored / s_enc below 2^-126 for s_enc near 2^126, loses
    more)."""
    x = _nvfp4_input(data)
    _, _, gs = ct_quantize_nvfp4(x)
    ref = quantize_nvfp4(x, global_encode_scale=gs, variant=CT)
    theirs = ct_dequantize_nvfp4(ref.codes, ref.block_scales, gs)
    s_dec = nvfp4_decode_scale(gs, "encode")
    ours = dequantize_nvfp4(ref.codes, ref.block_scales, s_dec)
    e2m1 = decode(ref.codes, E2M1)
    stored = decode(ref.block_scales, E4M3FN).repeat_interleave(16, -1)
    assert torch.equal(theirs, e2m1 * (stored / gs))
    assert torch.equal(ours, (e2m1.double() * stored.double() * s_dec.double()).float())
    normal = ((stored / gs) >= 2.0**-126) & (ours.abs() >= 2.0**-126)
    gap = (theirs.double() - ours.double()).abs()
    assert bool((gap <= ours.double().abs() * 2.0**-22)[normal].all())


# ---- FP8 ---------------------------------------------------------------------------------------------------------

_GRANULARITY = {"tensor": (Granularity.PER_TENSOR, None), "channel": (Granularity.PER_TOKEN, None),
                "block": (Granularity.PER_BLOCK, (128, 128))}
_FLOOR = torch.tensor(1.0 / (448.0 * 512.0))  # the reference's dynamic-scale floor (vLLM's MIN_SCALING_FACTOR)
_EPS = torch.tensor(2.0**-23)  # calculate_qparams' replacement for a zero fp32 scale: torch.finfo(float32).eps


def _group_amax(x: torch.Tensor, strategy: str) -> torch.Tensor:
    a = x.abs()
    if strategy == "tensor":
        return a.amax().reshape(1, 1)
    if strategy == "channel":
        return a.amax(-1, keepdim=True)
    n, k = x.shape
    return a.reshape(n // 128, 128, k // 128, 128).amax(dim=(1, 3))


def _check_fp8(x: torch.Tensor, strategy: str) -> None:
    codes, scale = ct_quantize_fp8(x, strategy)
    gran, block = _GRANULARITY[strategy]
    q = _group_amax(x, strategy) / 448.0
    theirs = scale.reshape(q.shape)  # [1] per tensor; [N, 1] and [N/128, K/128] already the reference's shape
    # its scale is fl(amax / 448), 2^-23 where that is 0 (no floor); the reference's dynamic scale is
    # max(fl(amax / 448), 1 / (448 * 512)): equal wherever fl(amax / 448) reaches that floor
    assert torch.equal(theirs, torch.where(q == 0, _EPS, q))
    assert torch.equal(quantize_fp8(x, E4M3FN, granularity=gran, block_shape=block).scale, torch.maximum(q, _FLOOR))
    # codes: RNE of clamp(fl(x / scale), +-448) on both sides, given its scale
    ref = quantize_fp8(x, E4M3FN, granularity=gran, block_shape=block, scale=theirs).codes.view(torch.uint8)
    # divergence: the compressor adds the symmetric zero point (0.0, which compressed-tensors registers on every
    # module by default) to x / scale, and -0.0 + 0.0 = +0.0: a negative x whose quotient is -0.0 (x is -0.0, or
    # the division underflows) stores 0x00 where the reference keeps 0x80; both are zero. Every other code agrees.
    per_element = theirs.repeat_interleave(x.shape[0] // q.shape[0], 0).repeat_interleave(x.shape[1] // q.shape[1], 1)
    minus_zero = torch.signbit(x) & (x / per_element == 0)
    assert bool((codes[minus_zero] == 0x00).all()) and bool((ref[minus_zero] == 0x80).all())
    assert torch.equal(codes[~minus_zero], ref[~minus_zero]), (codes, ref)
    # dequantization: fl(decode(code) * scale) on both sides
    assert torch.equal(ct_dequantize_fp8(codes, scale, strategy), dequantize_fp8(codes, theirs, E4M3FN))


FP8_CORNERS = {
    "all_zero_tensor": [[0.0] * 32, [0.0] * 32],
    # amax 448: scale 1, so 17 and 19 are E4M3 ties (to 16 and 20), 464 is absent (above the amax)
    "e4m3_ties_at_scale_one": [[448.0, 17.0, 19.0, -17.0, 2.0**-10, 3 * 2.0**-10, -448.0, 0.0] * 4],
    # -0.0: 0x00 from compressed-tensors (its zero point), 0x80 from the reference; a zero row beside a nonzero one
    # (per channel: its scale 2^-23, the reference's the floor)
    "negative_zero_and_zero_row": [[-0.0, 1.0, -1.0, 0.5] * 8, [0.0] * 16 + [-0.0] * 16],
    # amax / 448 below the reference's floor 1 / (448 * 512): the scales differ, the codes given its scale agree
    "below_the_floor": [[1e-4, -3e-5, 7e-6, 0.0] * 8, [1e-40, -1e-41, 0.0, 1e-45] * 8],
}


@pytest.mark.parametrize("strategy", ["tensor", "channel"])
@pytest.mark.parametrize("name", list(FP8_CORNERS))
def test_ct_fp8_matches_the_reference_on_named_corners(name, strategy):
    _check_fp8(torch.tensor(FP8_CORNERS[name], dtype=torch.float32), strategy)


@pytest.mark.parametrize("strategy", ["tensor", "channel"])
@given(data=st.data())
def test_ct_fp8_per_tensor_and_per_channel_match_the_reference(strategy, data):
    _check_fp8(data.draw(mx_tensor(E4M3FN, rows=2)), strategy)


@st.composite
def fp8_block_weight(draw) -> torch.Tensor:
    """[256, 256]: four 128 x 128 blocks, each Gaussian at its own magnitude 2^e (e from fp32-subnormal to large),
    all-zero, or one-hot; a few elements pinned to the block's amax and an E4M3 tie of its scale."""
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    w = torch.zeros(256, 256)
    for i in range(2):
        for j in range(2):
            kind = draw(st.sampled_from(("gaussian", "gaussian", "zero", "one_hot")))
            scale = 2.0 ** draw(st.integers(-140, 100))
            blk = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            if kind == "gaussian":
                blk.copy_(torch.randn(128, 128, generator=g) * scale)
                blk[0, 0] = 448.0 * scale  # amax 448 * 2^e: scale 2^e, so 17 * 2^e is an exact tie
                blk[0, 1] = -17.0 * scale
            elif kind == "one_hot":
                r, c = torch.randint(0, 128, (2,), generator=g).tolist()
                blk[r, c] = scale
    return torch.nan_to_num(w, posinf=3e38, neginf=-3e38)


def test_ct_fp8_block_matches_the_reference_on_named_corners():
    w = torch.zeros(256, 256)
    w[:128, :128] = torch.tensor(FP8_CORNERS["e4m3_ties_at_scale_one"][0]).repeat(128, 4)
    w[128:, :128] = 1e-40  # a block far below the floor; the block at [:128, 128:] stays all zero
    w[128:, 128:] = -0.0
    w[200, 200] = 2688.0
    _check_fp8(w, "block")


@settings(max_examples=min(settings.default.max_examples, 25))  # 64K elements an example: a few dozen suffice
@given(w=fp8_block_weight())
def test_ct_fp8_block_128x128_matches_the_reference(w):
    _check_fp8(w, "block")


def test_ct_fp8_of_an_all_zero_tensor_stores_eps_where_the_reference_stores_its_floor():
    """Divergence by design, not a defect: calculate_qparams replaces a zero scale by torch.finfo(float32).eps =
    2^-23 and has no floor (a group with amax below 1 / 512 keeps fl(amax / 448)); the reference's dynamic scale
    floors at 1 / (448 * 512), vLLM's MIN_SCALING_FACTOR. Both keep the zeros zero (codes 0)."""
    codes, scale = ct_quantize_fp8(torch.zeros(2, 32), "channel")
    assert torch.equal(scale, torch.full((2, 1), 2.0**-23)) and bool((codes == 0).all())
    ref = quantize_fp8(torch.zeros(2, 32), E4M3FN, granularity=Granularity.PER_TOKEN)
    assert torch.equal(ref.scale, torch.full((2, 1), float(_FLOOR))) and bool((ref.codes == 0).all())
