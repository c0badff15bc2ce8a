"""The bit-placement FP4 decode contract (harness/backends/fp4_bits.py, issue 15), exhaustively: every byte
(two E2M1 codes) under every E8M0 scale a path may meet equals the reference dequantization rounded to bf16
(which is exact), bit for bit, in both multiply orders; 0xFF and unfoldable scales are declined with a reason."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.backends.fp4_bits import E8M0_FOLDABLE_MAX, decode_mxfp4_bitplace, place_e2m1, place_e4m3
from harness.backends.triton_kernels import _fp4_bitplace_tile, _in_order, tl, triton
from harness.core.conformance import moe_property_examples
from reference.formats import E2M1, E4M3FN
from reference.mx import dequantize_mx
from reference.packing import pack_fp4, unpack_fp4


def _every_byte_under(scales: range) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of 32 codes (16 bytes): all 256 bytes in 16 rows, repeated for each scale."""
    packed = torch.arange(256, dtype=torch.uint8).reshape(16, 16).repeat(len(scales), 1)
    s = torch.tensor(list(scales), dtype=torch.uint8).repeat_interleave(16)[:, None]
    return packed, s


def test_placement_is_the_code_value_times_2_pow_minus_126():
    placed = place_e2m1(torch.arange(16, dtype=torch.uint8)).double()
    assert torch.equal(placed * 2.0**126, E2M1.values.double())


def test_nvfp4_factor_placed_and_folded_decodes_every_code_and_scale_to_value_times_2_pow_minus_7():
    """NVFP4 in triton_bitplace: every finite E4M3 code (subnormals included) placed into bf16 bits (value
    x 2^-120) and multiplied by 2^127, then 2^112 (bf16 multiplies, in the kernel's order: neither leaves bf16's
    range) is its value x 2^119; every placed E2M1 code (value x 2^-126) times that factor, one bf16 multiply as
    the kernel does, is exactly code value x scale x 2^-7, a bf16 normal: the global scale takes the 2^7."""
    codes = torch.arange(256, dtype=torch.uint8)
    want = E4M3FN.values.double()
    finite = torch.isfinite(want)
    bf = lambda x: torch.tensor(x, dtype=torch.bfloat16)  # noqa: E731
    factor = place_e4m3(codes) * bf(2.0**127) * bf(2.0**112)
    assert torch.equal(factor.double()[finite], want[finite] * 2.0**119)
    placed = place_e2m1(torch.arange(16, dtype=torch.uint8))
    products = placed[:, None] * factor[finite][None, :]  # [E2M1 code, scale]: bf16 x bf16 -> bf16
    exact = E2M1.values.double()[:, None] * want[finite][None, :] * 2.0**-7
    assert torch.equal(products.double(), exact)
    nonzero = exact != 0
    assert bool((exact[nonzero].abs() >= 2.0**-126).all())  # normal: no flush anywhere downstream can bite


def test_nvfp4_factor_by_an_exponent_add_equals_the_multiplies_for_every_normal_scale():
    """triton_kernels._nvfp4_factor_words' NORMAL path in torch (int64 words standing for the kernel's int32): with
    four scale bytes in a word sw, even = ((sw & 0x007F007F) << 4) + 0x77807780 | (sw & 0x00800080) << 8 holds bytes
    0 and 2 in its halves, odd the same of sw >> 8 (arithmetic) bytes 1 and 3; each half is the bf16 bits of that
    byte's value x 2^119, the two multiplies' value (above), for every normal E4M3 code in every byte position beside
    any other bytes. Zero and subnormal codes come out wrong (so prepare() sets NV_NORMAL only without them)."""
    codes = torch.arange(256, dtype=torch.int64)
    normal = ((codes & 0x78) != 0) & ((codes & 0x7F) != 0x7F)
    bf = lambda x: torch.tensor(x, dtype=torch.bfloat16)  # noqa: E731
    want = (place_e4m3(codes.to(torch.uint8)) * bf(2.0**127) * bf(2.0**112)).view(torch.int16).to(torch.int64) & 0xFFFF
    g = torch.Generator().manual_seed(5)
    for pos in range(4):
        others = torch.randint(0, 256, (256, 4), generator=g)
        others[:, pos] = codes
        sw = sum(others[:, i] << (8 * i) for i in range(4))
        sw = (sw ^ 0x80000000) - 0x80000000  # as a signed int32
        even = (((sw & 0x007F007F) << 4) + 0x77807780) | ((sw & 0x00800080) << 8)
        odd = ((((sw >> 8) & 0x007F007F) << 4) + 0x77807780) | (((sw >> 8) & 0x00800080) << 8)
        got = ((even if pos % 2 == 0 else odd) >> (16 * (pos // 2))) & 0xFFFF
        assert torch.equal(got[normal], want[normal]), pos
        low = (codes & 0x78) == 0  # zero and subnormal: the add is not the multiply
        assert not bool((got[low] == want[low]).any()), pos


def test_nvfp4_factor_from_biased_codes_equals_the_multiplies_for_every_positive_normal_scale():
    """NORMAL 2 (triton_kernels._nvfp4_factor_halves) in torch: prepare() stores each positive normal E4M3 code s as
    s + 0x78 (triton_bitplace._NV_BIAS, through bitplace_scales), each word of four rotated left by 4 bits; with such
    a stored word sw, even = (sw & 0x0FF00FF0) | 0x70007000 holds bytes 0 and 2 in its halves, odd the same of sw
    rotated right by 8 bits bytes 1 and 3; each half is the bf16 bits of the code's value x 2^119 (the two
    multiplies' value) for every positive normal code in every byte position beside any other such bytes. A negative
    code cannot be stored so (bitplace_scales refuses it; prepare() keeps NV_NORMAL 1 then)."""
    from harness.backends.triton_bitplace import _NV_BIAS, bitplace_scales, unbitplace_scales

    codes = torch.arange(0x08, 0x7F, dtype=torch.int64)  # the positive normal codes
    bf = lambda x: torch.tensor(x, dtype=torch.bfloat16)  # noqa: E731
    want = (place_e4m3(codes.to(torch.uint8)) * bf(2.0**127) * bf(2.0**112)).view(torch.int16).to(torch.int64) & 0xFFFF
    g = torch.Generator().manual_seed(6)
    for pos in range(4):
        others = torch.randint(0x08, 0x7F, (len(codes), 4), generator=g)
        others[:, pos] = codes
        stored = bitplace_scales(others.to(torch.uint8)[None], False, 4, _NV_BIAS)[0].to(torch.int64)
        assert torch.equal(unbitplace_scales(stored.to(torch.uint8)[None], 4, False, _NV_BIAS)[0].to(torch.int64),
                           others)
        sw = sum(stored[:, i] << (8 * i) for i in range(4))  # (unsigned: a rotate moves no sign bits)
        even = (sw & 0x0FF00FF0) | 0x70007000
        odd = ((((sw >> 8) | (sw << 24)) & 0xFFFFFFFF) & 0x0FF00FF0) | 0x70007000
        got = ((even if pos % 2 == 0 else odd) >> (16 * (pos // 2))) & 0xFFFF
        assert torch.equal(got, want), pos
    for bad in (0x00, 0x05, 0x7F, 0x88):  # zero, subnormal, NaN, negative
        with pytest.raises(ValueError, match="positive normal"):
            bitplace_scales(torch.full((1, 1, 4), bad, dtype=torch.uint8), False, 8, _NV_BIAS)


def _matches_reference(decode, top: int) -> bool:
    packed, s = _every_byte_under(range(0, top + 1))
    got = decode(packed, s)
    want = dequantize_mx(unpack_fp4(packed), s, E2M1)
    finite = torch.isfinite(want)
    assert torch.equal(want[finite].bfloat16().float(), want[finite])  # every finite product is a bf16 value
    # bit for bit where finite; past bf16's range (scale 254, |code| >= 2) the same infinity on both sides
    return torch.equal(got[finite].view(torch.int16), want[finite].bfloat16().view(torch.int16)) and torch.equal(
        got[~finite].float(), want[~finite])


@pytest.mark.parametrize("fold", [True, False], ids=["one_multiply", "two_multiplies"])
def test_every_byte_under_every_scale_equals_the_reference(fold):
    top = E8M0_FOLDABLE_MAX if fold else 254
    assert _matches_reference(lambda p, s: decode_mxfp4_bitplace(p, s, fold=fold), top)


def test_scale_0xff_is_declined():
    packed, s = _every_byte_under(range(255, 256))
    with pytest.raises(ValueError, match="0xFF"):
        decode_mxfp4_bitplace(packed, s, fold=False)


def test_a_scale_above_2_cannot_fold_the_bias():
    packed, s = _every_byte_under(range(E8M0_FOLDABLE_MAX + 1, E8M0_FOLDABLE_MAX + 2))
    with pytest.raises(ValueError, match="cannot fold"):
        decode_mxfp4_bitplace(packed, s, fold=True)


@pytest.mark.parametrize("wrong", ["nibbles_swapped", "bias_off_by_one"])
def test_the_exhaustive_check_catches_a_wrong_decode(wrong):
    def decode(packed, s):
        if wrong == "nibbles_swapped":
            return decode_mxfp4_bitplace((packed << 4) | (packed >> 4), s)
        return decode_mxfp4_bitplace(packed, s) * 2.0  # 2^E instead of 2^(E - 1)

    assert not _matches_reference(decode, E8M0_FOLDABLE_MAX)


def test_the_bitplace_backend_folds_only_where_exact():
    """triton_bitplace uses the placement where every block scale is <= 2 and falls back to the emulation's
    decode otherwise (a scale of 2^13, the NaN scale): never a rounded fold."""
    import dataclasses

    from harness.backends.triton_bitplace import TritonBitplaceBackend
    from harness.core.conformance import SHAPES, case_checkpoint

    ckpt = case_checkpoint("w_mxfp4", "SILU", "e4m3fn", SHAPES["cpu"], 0, False)
    backend = TritonBitplaceBackend()
    assert backend.prepare(ckpt).constexprs == dict(BITPLACE=True, ROW_PAIRS=backend.row_pairs)
    for code in (E8M0_FOLDABLE_MAX + 1, 127 + 13, 0xFF):
        scale = ckpt.w2.scale.clone()
        scale[0, 0, 0] = code
        big = dataclasses.replace(ckpt, w2=dataclasses.replace(ckpt.w2, scale=scale))
        assert backend.prepare(big).constexprs == dict(BITPLACE=False), code


def test_nvfp4_factors_by_an_exponent_add_only_where_every_scale_is_normal(monkeypatch):
    """prepare() of an NVFP4 checkpoint sets NV_NORMAL (the factors' exponent by an integer add) where every block
    scale of both GEMMs is a normal E4M3 number; one zero, negative zero or subnormal scale anywhere leaves the
    multiplies (the add would give it 2^112 x (1 + m / 8)). Where every one is positive too, NV_NORMAL is 2 and the
    codes are stored plus 0x78 (NVFP4_BIASED_SCALES); one negative normal scale keeps them as they are (NV_NORMAL 1)."""
    import dataclasses

    from harness.backends import triton_bitplace
    from harness.backends.triton_bitplace import TritonBitplaceBackend
    from harness.core.conformance import SHAPES, case_checkpoint

    ckpt = case_checkpoint("w_nvfp4", "SILU", "e4m3fn", SHAPES["cpu"], 0, False)
    backend = TritonBitplaceBackend()
    monkeypatch.setattr(triton_bitplace, "NVFP4_EXPONENT_ADD", False)
    assert backend.prepare(ckpt).constexprs == dict(BITPLACE=True, ROW_PAIRS=backend.row_pairs)
    monkeypatch.setattr(triton_bitplace, "NVFP4_EXPONENT_ADD", True)
    monkeypatch.setattr(triton_bitplace, "NVFP4_BIASED_SCALES", False)
    assert backend.prepare(ckpt).constexprs == dict(BITPLACE=True, ROW_PAIRS=backend.row_pairs, NV_NORMAL=True)
    monkeypatch.setattr(triton_bitplace, "NVFP4_BIASED_SCALES", True)  # every scale positive too: stored biased
    prep = backend.prepare(ckpt)
    assert prep.constexprs == dict(BITPLACE=True, ROW_PAIRS=backend.row_pairs, NV_NORMAL=2)
    for stored in (prep.w13_scale, prep.w2_scale):  # every code biased (0x80-0xF6; zero bytes pad rows to chunks),
        codes = triton_bitplace._rotate_words_right_4(stored)  # each word stored rotated left by 4 bits
        assert int(codes[codes != 0].min()) >= 0x80 and int(codes.max()) <= 0xF6
        assert not torch.equal(codes, stored)
    for which, code, mode in (("w2", 0x00, None), ("w13", 0x80, None), ("w2", 0x05, None), ("w13", 0x87, None),
                              ("w2", 0xB8, True), ("w13", 0xF0, True)):  # a negative normal scale: NV_NORMAL 1
        scale = getattr(ckpt, which).scale.clone()
        scale[-1, -1, -1] = code
        low = dataclasses.replace(ckpt, **{which: dataclasses.replace(getattr(ckpt, which), scale=scale)})
        want = dict(BITPLACE=True, ROW_PAIRS=backend.row_pairs, **({"NV_NORMAL": mode} if mode else {}))
        assert backend.prepare(low).constexprs == want, (which, code)


@pytest.mark.parametrize("k", [2880, 7168, 2048, 768, 160], ids=lambda k: f"K{k}")
@pytest.mark.parametrize("mx", [True, False], ids=["mxfp4", "nvfp4"])
def test_the_bitplace_scale_layout_pads_rows_to_chunks_and_inverts(k, mx):
    """triton_bitplace's scale layout at the models' K (gpt-oss's 2880: 90 MX blocks per row, not a whole
    number of 128-value chunks): rows padded to chunks with zero bytes, the MX fold added, and undone exactly."""
    from harness.backends.triton_bitplace import bitplace_scales, unbitplace_scales

    blocks, per_chunk = (k // 32, 4) if mx else (k // 16, 8)
    top = E8M0_FOLDABLE_MAX if mx else 255
    s = torch.randint(0, top + 1, (2, 3, blocks), generator=torch.Generator().manual_seed(k), dtype=torch.uint8)
    words = bitplace_scales(s, mx, per_chunk)
    assert words.shape == (2, 3, -(-k // 128) * per_chunk) and words.is_contiguous()
    assert not words[..., blocks:].any()
    assert torch.equal(unbitplace_scales(words, blocks, mx), s)
    if mx:
        assert torch.equal(words[..., :blocks].long(), s.long() + 126)  # the exponent field of 2^(s - 1)
        with pytest.raises(ValueError, match="fold"):
            bitplace_scales(torch.full((1, 1, 1), E8M0_FOLDABLE_MAX + 1, dtype=torch.uint8), mx, per_chunk)


@pytest.mark.parametrize("k", [2880, 7168, 2048, 768, 160], ids=lambda k: f"K{k}")
def test_the_mma_order_of_codes_is_a_padded_permutation_that_inverts(k):
    """The codes' layout (triton_bitplace.mma_order_codes) at the models' K: rows padded with zero codes to
    128-value chunks, a permutation inside each chunk, undone by natural_order_codes."""
    from harness.backends.triton_bitplace import mma_order_codes, natural_order_codes, word_codes

    packed = torch.randint(0, 256, (2, 3, k // 2), generator=torch.Generator().manual_seed(k), dtype=torch.uint8)
    stored = mma_order_codes(packed)
    assert stored.shape == (2, 3, -(-k // 128) * 64)
    assert torch.equal(natural_order_codes(stored, k), packed)
    codes = word_codes(stored).flatten(-2)  # the same codes, rearranged
    assert torch.equal(codes.sort(-1).values[..., -k:], unpack_fp4(packed).sort(-1).values)


def test_each_thread_group_finds_its_wgmma_columns_in_16_contiguous_bytes():
    """The stored order, named position by position: bytes 16t..16t+15 of a chunk hold exactly the columns
    16j + 2t + {0, 1, 8, 9} (j = 0..7) that thread-group t of the wgmma register operand multiplies; word q holds
    j = 2q, 2q + 1 (one 32-value MX block), columns c and c + 1 as its codes n and n + 4 (one bf16x2 register)."""
    from harness.backends.triton_bitplace import mma_order_codes, word_codes

    column = torch.arange(128)
    # mark each column by its code: only 16 codes exist, so place column c's identity in two passes
    got = torch.zeros(128, dtype=torch.long)
    for nibble in range(2):
        ids = ((column >> (4 * nibble)) & 0xF).to(torch.uint8)
        stored = word_codes(mma_order_codes(pack_fp4(ids).view(1, 1, 64))).view(128).long()
        got |= stored << (4 * nibble)
    for t in range(4):
        want = [16 * j + 2 * t + d for j in range(8) for d in (0, 8, 1, 9)]
        assert sorted(got[32 * t:32 * t + 32].tolist()) == sorted(want)
        word0 = got[32 * t:32 * t + 8].tolist()
        assert word0 == [2 * t, 2 * t + 8, 2 * t + 16, 2 * t + 24, 2 * t + 1, 2 * t + 9, 2 * t + 17, 2 * t + 25]


@pytest.mark.parametrize("tiles", [{}, dict(block_n=128, w2_block_n=128), dict(block_n=64, w2_block_n=128),
                                   dict(block_n=64, mma_steps=2), dict(block_n=64, split_k=2),
                                   dict(block_n=128, split_k=3)],
                         ids=["default", "two_reps", "w2_two_reps", "mma_steps", "split_k", "split_k_empty_splits"])
@pytest.mark.parametrize("scheme", ["w_mxfp4", "w_nvfp4"])
def test_the_bitplace_kernel_reads_k_tails(scheme, tiles):
    """K not a multiple of the 128-wide K step, nor of a word of scales (H = 160: 5 MX blocks, I = 96: 3), N not a
    multiple of the tile: the kernel's padded chunks, masked rows and scale words against the reference (CPU: the
    fp32 twin), with one and two 64-row repeats per tile, two MMA steps per chunk, and split-K (partial sums
    added by splitk_epilogue_kernel; 3 splits of 2 chunks leave one empty)."""
    from harness.backends.triton_bitplace import TritonBitplaceBackend
    from harness.core.conformance import Shape, backend_shape, compare_backend, reference_run
    from harness.backends import backend_structure

    backend = TritonBitplaceBackend()
    if tiles:
        backend.configure(block_m=16, block_k=128, num_warps=4, num_stages=2, **tiles)
    shape = backend_shape(backend, Shape(num_experts=4, hidden_size=160, intermediate_size=96, tokens=7, top_k=3))
    ckpt, inputs, out, trace = reference_run(scheme, "SWIGLUOAI", "e4m3fn", shape, 3, backend_structure(backend))
    assert backend.prepare(ckpt).constexprs.items() >= dict(BITPLACE=True, ROW_PAIRS=backend.row_pairs).items()
    result = compare_backend(backend, ckpt, inputs, out, trace, f"K tail/{scheme}")
    assert result.ok, result.message()


@pytest.mark.parametrize("kernel,split_k", [("triton_bitplace", 2), ("triton_bitplace", 1), ("triton_emulation", 1)])
@pytest.mark.parametrize("scheme,act", [("w_mxfp4", "SWIGLUOAI"), ("w_nvfp4_a_nvfp4", "SILU")])
def test_epilogues_that_do_the_next_step_are_bit_for_bit_the_launches_they_replace(scheme, act, kernel, split_k):
    """splitk_topk_reduce_kernel (GEMM2's split-K sums, scales, bias, gemm2_out rounding and the weighted top-k sum
    in one launch) gives the outputs of splitk_epilogue_kernel then topk_reduce_kernel bit for bit, and GEMM1's
    epilogue quantizing GEMM2's NVFP4 activations (split-K's epilogue kernel, or the GEMM's own: bit placement and
    the dequantizing loop) those of nvfp4_quantize_kernel, with biases, static activation scales and per-expert
    global scales (a fold that drops the bias, rounds once less or skips the quantization fails it)."""
    from harness.backends import load_backend
    from harness.core.conformance import Shape, backend_shape, case_checkpoint, case_inputs

    outs = []
    for fold in (False, True):
        backend = load_backend(kernel).configure(block_m=16, block_n=64, block_k=128, num_warps=4,
                                                       num_stages=2, **(dict(split_k=split_k) if split_k > 1 else {}))
        backend.fold_epilogues = fold
        shape = backend_shape(backend, Shape(num_experts=5, hidden_size=160, intermediate_size=96, tokens=3, top_k=3))
        ckpt = case_checkpoint(scheme, act, "e4m3fn", shape, seed=4, bias=True)
        x, w, ids = case_inputs(shape, 4)
        outs.append(backend.forward(backend.prepare(ckpt), x, w, ids))
    assert ckpt.b2 is not None and (ckpt.scheme.act is None) == (scheme == "w_mxfp4")
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16))
    assert outs[1].abs().sum() > 0


@pytest.mark.parametrize("scheme,act,split_k", [("w_mxfp4", "SWIGLUOAI", 3), ("w_nvfp4_a_nvfp4", "SILU", 2)])
def test_serial_split_k_finishes_each_tile_in_the_gemms_launch_with_the_epilogue_kernels_bits(scheme, act, split_k,
                                                                                            monkeypatch):
    """serial_k (moe_gemm_kernel's SERIAL_K): each tile's last split adds the partial sums in split order and runs
    the epilogue in the GEMM's own launch, bit for bit splitk_epilogue_kernel's (biases, static activation scales,
    per-expert global scales, GEMM1's epilogue quantizing GEMM2's NVFP4 input; GEMM2 too where its top-k sum is not
    folded; 3 splits of 2 K chunks: one split empty), with no splitk_epilogue_kernel launched; twice in a row, so that
    a tile count left unreset (the second call's tiles would never finish) fails, and the counts are zero after."""
    from harness.backends import load_backend
    from harness.backends import triton_kernels as K
    from harness.backends.compile_check import LaunchLog
    from harness.core.conformance import Shape, backend_shape, case_checkpoint, case_inputs

    monkeypatch.setattr(K, "splitk_epilogue_kernel", LaunchLog(K.splitk_epilogue_kernel))
    epilogues = K.splitk_epilogue_kernel.grids
    for fold, serials in ((True, (0, 1, 1)), (False, (0, 1))):
        outs = []
        backend = load_backend("triton_bitplace")
        backend.fold_epilogues = fold
        for serial in serials:
            backend.configure(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=2, split_k=split_k,
                              serial_k=serial)
            shape = backend_shape(backend, Shape(num_experts=5, hidden_size=160, intermediate_size=96, tokens=3,
                                                 top_k=3))
            ckpt = case_checkpoint(scheme, act, "e4m3fn", shape, seed=4, bias=True)
            x, w, ids = case_inputs(shape, 4)
            epilogues.clear()
            outs.append(backend.forward(backend.prepare(ckpt), x, w, ids))
            # GEMM1's epilogue kernel, and GEMM2's where the top-k sum is not folded, run only without serial_k
            assert len(epilogues) == (0 if serial else 1 if fold else 2), (fold, serial, epilogues)
            assert not serial or not any(bool(c.any()) for held in backend._tile_counts.values() for c in held)
        assert outs[0].abs().sum() > 0
        for out in outs[1:]:
            assert torch.equal(out.view(torch.int16), outs[0].view(torch.int16)), (fold, scheme, split_k)

@pytest.mark.parametrize("scheme,act", [("w_mxfp4", "SWIGLUOAI"), ("w_nvfp4_a_nvfp4", "SILU")])
def test_split_k_epilogue_programs_as_tall_as_the_calls_pairs_give_the_same_bits(scheme, act, monkeypatch):
    """EPILOGUE_FIT_PAIRS: splitk_epilogue_kernel at 4 pairs a program (one token, top 3) instead of 16 gives the same
    bits (rows are independent in the epilogue: scales, bias, activation, and GEMM1's NVFP4 quantization of GEMM2's
    input along each row's 16-column blocks), with GEMM2's epilogue unfolded too; the launches take BLOCK_P 4."""
    from harness.backends import load_backend
    from harness.backends import triton_emulation
    from harness.backends import triton_kernels as K
    from harness.core.conformance import Shape, backend_shape, case_checkpoint, case_inputs

    real, block_p = K.splitk_epilogue_kernel, []

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                block_p.append(kwargs["BLOCK_P"])
                return real[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(K, "splitk_epilogue_kernel", Spy())
    outs = []
    for fit in (False, True):
        monkeypatch.setattr(triton_emulation, "EPILOGUE_FIT_PAIRS", fit)
        backend = load_backend("triton_bitplace")
        backend.fold_epilogues = False
        backend.configure(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=2, split_k=2)
        shape = backend_shape(backend, Shape(num_experts=5, hidden_size=160, intermediate_size=96, tokens=1, top_k=3))
        ckpt = case_checkpoint(scheme, act, "e4m3fn", shape, seed=4, bias=True)
        x, w, ids = case_inputs(shape, 4)
        block_p.clear()
        outs.append(backend.forward(backend.prepare(ckpt), x, w, ids))
        assert block_p == ([4, 4] if fit else [16, 16]), (fit, block_p)
    assert outs[0].abs().sum() > 0
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16)), scheme


@pytest.mark.parametrize("scheme,act", [("w_mxfp4", "SWIGLUOAI"), ("w_nvfp4_a_nvfp4", "SILU")])
def test_the_gluon_kernels_serial_epilogue_gets_what_splitk_epilogue_kernel_would(scheme, act, monkeypatch):
    """serial_k through the Gluon kernel (compiled only on the CPU, run on the H200: results/gpu-issue28/run-22): its
    launch for GEMM1 (and GEMM2's where its top-k sum is not folded) gets, as SERIAL's operands, exactly the scales,
    bias, output, scalars and flags that the splitk_epilogue_kernel launch it replaces gets without serial_k (biases, a
    static activation scale and GEMM1's NVFP4 quantization of GEMM2's input among them), a tile count buffer of zeros,
    and no epilogue kernel launches."""
    from harness.backends import gluon_kernels, load_backend
    from harness.backends import triton_kernels as K
    from harness.backends.compile_check import LaunchLog
    from harness.core.conformance import Shape, backend_shape, case_checkpoint, case_inputs

    gluon_launches = []
    def launch(*args, **kwargs):  # nothing runs: zeros for its outputs (the kernels after it then read finite values)
        gluon_launches.append((args, kwargs.get("serial")))
        for out in (args[4], *([kwargs["serial"]["final_ptr"]] if kwargs.get("serial") else [])):
            out.zero_()

    monkeypatch.setattr(gluon_kernels, "launch_bitplace_partials", launch)
    monkeypatch.setattr(K, "splitk_epilogue_kernel", LaunchLog(K.splitk_epilogue_kernel, run=False))
    for kernel in ("splitk_topk_reduce_kernel", "topk_reduce_kernel", "nvfp4_quantize_kernel"):  # (after them)
        monkeypatch.setattr(K, kernel, LaunchLog(getattr(K, kernel), run=False))
    epilogues = K.splitk_epilogue_kernel.calls
    backend = load_backend("triton_bitplace_gluon")
    backend.device = "cpu"
    shape = backend_shape(backend, Shape(num_experts=4, hidden_size=256, intermediate_size=128, tokens=2, top_k=2))
    monkeypatch.setattr(K, "INTERPRET", False)  # prepare() then lays out the kernel's per-chunk scale copy
    prepared = backend.prepare(case_checkpoint(scheme, act, "e4m3fn", shape, seed=3, bias=True))
    monkeypatch.setattr(K, "INTERPRET", True)
    x, w, ids = case_inputs(shape, 5)
    for fold in (True, False):  # GEMM1 serial; both GEMMs (GEMM2's top-k sum not folded)
        backend.fold_epilogues = fold
        gluon_launches.clear()
        epilogues.clear()
        for serial in (0, 1):
            backend.configure(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=4, split_k=2,
                              serial_k=serial)
            backend.forward(prepared, x, w, ids)
        serial_gemms = 1 if fold else 2
        assert len(gluon_launches) == 4 and len(epilogues) == serial_gemms, (fold, len(gluon_launches), len(epilogues))
        assert [launch[1] is None for launch in gluon_launches] == [True, True, False, fold]
        for (args, want_kw), (launch, got) in zip(epilogues, gluon_launches[2:]):
            _same_epilogue_operands(args, want_kw, launch, got)
        assert got["HAS_BIAS"] and got["QUANT_NVFP4"] == (fold and scheme == "w_nvfp4_a_nvfp4")


def _same_epilogue_operands(args, want_kw, launch, got):
    """A serial Gluon launch (launch_bitplace_partials' positional args, its serial operands) against the
    splitk_epilogue_kernel launch it replaces (args, kwargs): splitk_epilogue_kernel(part, ids, a_scale,
    expert_scale, bias, out, n_pairs, N_OUT, N_ROWS, alpha, beta, beta_lin, limit, ...) and launch (launcher, codes,
    scales, a, partials, sorted_rows, block_expert, n_pairs, a_row_div, n_out, n_rows, k_dim, gated, split_k, ...).
    The same tensors (by address: a view of the same storage is the same operand), or where absent the same
    stand-in (the launch's own output); the same sizes, scalars and flags; a tile count buffer of zeros."""
    for name, i in (("a_scale_ptr", 2), ("expert_scale_ptr", 3), ("bias_ptr", 4)):
        if args[i] is args[5]:
            assert got[name] is got["final_ptr"], name
        else:
            assert got[name].data_ptr() == args[i].data_ptr() and got[name].dtype == args[i].dtype, name
    if want_kw["q_scale_ptr"] is args[5]:
        assert got["q_scale_ptr"] is got["final_ptr"]
    else:
        assert got["q_scale_ptr"].data_ptr() == want_kw["q_scale_ptr"].data_ptr()
    assert got["final_ptr"].shape == args[5].shape and got["final_ptr"].dtype == args[5].dtype
    assert launch[4].shape == args[0].shape and launch[4].dtype == args[0].dtype  # the partial sums
    assert (launch[7], launch[9], launch[10]) == tuple(args[6:9])  # pairs, N_OUT, N_ROWS
    assert (launch[12], launch[13]) == (want_kw["GATED"], want_kw["SPLIT_K"])
    assert [got[k] for k in ("alpha", "beta", "beta_lin", "limit")] == list(args[9:13])
    for flag in ("A_SCALE", "HAS_EXPERT_SCALE", "HAS_BIAS", "INTERLEAVED", "ACT", "APPLY_ACT", "HAS_LIMIT",
                 "QUANT_NVFP4"):
        assert got[flag] == want_kw[flag], flag
    assert got["count_ptr"].dtype == torch.int32 and not bool(got["count_ptr"].any())


@triton.jit
def _block_order_kernel(out_ptr):
    i = tl.arange(0, 8) * 4
    tl.store(out_ptr + tl.arange(0, 32), tl.reshape(_in_order(i, i + 1, i + 2, i + 3), (32,)))


def test_the_four_block_factors_of_a_scale_word_come_out_in_block_order():
    """The compiled K loop builds NVFP4's four block factors of a scale word as d0, d2 (one word's halves) and d1, d3 (the
    other's) and must lay them out as blocks 0, 1, 2, 3 (triton_kernels._in_order): tl.join nests its new dim last,
    so the naive join(join(d0, d1), join(d2, d3)) gives 0, 2, 1, 3 (a session-15 review found exactly that)."""
    from harness.platforms import default_device

    out = torch.full((32,), -1, dtype=torch.int32, device=default_device())
    _block_order_kernel[(1,)](out)
    assert out.cpu().tolist() == list(range(32))


@triton.jit
def _decode_tile_kernel(out_ptr, w_ptr, ws_ptr, K, W_KIND: tl.constexpr, INTERPRET_DOT: tl.constexpr,
                        ROW_PAIRS: tl.constexpr):
    """Program ci: the 64 rows x 128 columns of chunk ci as the GEMM's K loop decodes them, stored as fp32."""
    ci = tl.program_id(0)
    tile = _fp4_bitplace_tile(w_ptr, ws_ptr, tl.program_id(1), 0, 1, 0, 64, ci, 64, K, W_KIND, 1, INTERPRET_DOT,
                              4, 0, ROW_PAIRS)
    cols = ci * 128 + tl.arange(0, 128)
    tl.store(out_ptr + tl.arange(0, 64)[:, None] * K + cols[None, :], tile.to(tl.float32))


@pytest.mark.parametrize("row_pairs", [False, True], ids=["rows", "row_pairs"])
@pytest.mark.parametrize("scheme", ["w_mxfp4", "w_nvfp4"])
def test_the_kernel_decodes_every_code_under_every_scale_exactly(scheme, row_pairs):
    """The K loop's weight tile itself (triton_kernels._fp4_bitplace_tile, from prepare()'s layouts), stored and
    compared with the reference dequantization: MXFP4 code x 2^(s - 127) for every E8M0 scale the fold takes
    (0..128, bf16 subnormals included), NVFP4 code x E4M3 scale x 2^-7 for every non-NaN E4M3 code (negative and
    subnormal scales included), every code at every column of a chunk. Compiled, this is the bf16 loop that builds
    each block's factor once as a bf16x2 word (MX: one integer multiply; NVFP4: byte permutes and _in_order); on
    the CPU the interpreter's fp32 twin."""
    from harness.backends import triton_kernels as K
    from harness.backends.triton_bitplace import bitplace_scales, mma_order_codes, pair_rows
    from harness.platforms import default_device
    from reference.mx import dequantize_mx

    mx = scheme == "w_mxfp4"
    block = 32 if mx else 16
    k = 128 * 9  # 64 rows x 9 chunks: 2304 MX blocks (each scale ~18 times), 4608 NVFP4 blocks (each ~18 times)
    g = torch.Generator().manual_seed(7)
    codes = torch.randint(0, 16, (64, k), generator=g, dtype=torch.uint8)
    blocks = torch.arange(64 * k // block).reshape(64, k // block)
    if mx:
        scales = (blocks % (E8M0_FOLDABLE_MAX + 1)).to(torch.uint8)
        want = dequantize_mx(codes, scales, E2M1)
    else:
        finite = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)
        scales = finite[blocks % len(finite)]
        want = (E2M1.values.double()[codes.long()] * E4M3FN.values.double()[scales.long()]
                .repeat_interleave(block, dim=1) * 2.0**-7)
    w = mma_order_codes(pack_fp4(codes)[None])
    ws = bitplace_scales(scales[None], mx, 128 // block)
    if row_pairs:
        w, ws = pair_rows(w, 64), pair_rows(ws, 128 // block)
    device = default_device()
    out = torch.full((64, k), float("nan"), dtype=torch.float32, device=device)
    _decode_tile_kernel[(k // 128, 1)](out, w.to(device), ws.to(device), k, 1 if mx else 2, K.INTERPRET, row_pairs)
    assert torch.equal(want.float().bfloat16().double(), want)  # every product is a bf16 value: exact is the bar
    got = out.cpu().double()
    bad = got != want
    assert not bad.any(), (f"{int(bad.sum())} of {bad.numel()} weights decoded wrong, first at (row, column) "
                           f"{tuple(bad.nonzero()[0].tolist())}: got {got[bad][0].item()!r}, want {want[bad][0].item()!r}")


@pytest.mark.parametrize("tiles", [{}, dict(block_n=128, w2_block_n=128, split_k=2)], ids=["default", "two_reps_split_k"])
@pytest.mark.parametrize("scheme,act", [("w_mxfp4", "SWIGLUOAI"), ("w_nvfp4", "SILU"), ("w_nvfp4_a_nvfp4", "SWIGLUOAI")])
def test_rows_stored_in_pairs_give_the_same_outputs_bit_for_bit(scheme, act, tiles):
    """Issue 28's whole-line layout (TritonBitplaceBackend.row_pairs: rows 2m, 2m + 1 side by side chunk by chunk,
    interleaved gate/up rows stored as halves first) only moves bytes and addresses: the outputs are the default
    layout's bit for bit, K tails and split-K included; pair_rows and deinterleave_rows are inverted exactly."""
    from harness.backends.triton_bitplace import TritonBitplaceBackend, pair_rows, unpair_rows
    from harness.core.conformance import Shape, backend_shape, case_inputs, case_checkpoint

    t = torch.randint(0, 256, (3, 6, 4 * 64), dtype=torch.uint8)
    assert torch.equal(unpair_rows(pair_rows(t, 64), 64), t) and not torch.equal(pair_rows(t, 64), t)
    outs = []
    for paired in (False, True):
        backend = TritonBitplaceBackend()
        backend.row_pairs = paired
        if tiles:
            backend.configure(block_m=16, block_k=128, num_warps=4, num_stages=2, **tiles)
        shape = backend_shape(backend, Shape(num_experts=4, hidden_size=160, intermediate_size=96, tokens=7, top_k=3))
        ckpt = case_checkpoint(scheme, act, "e4m3fn", shape, 3, True)
        x, w, ids = case_inputs(shape, 3)
        prep = backend.prepare(ckpt)
        assert prep.constexprs.items() >= dict(BITPLACE=True, ROW_PAIRS=paired).items()
        outs.append(backend.forward(prep, x, w, ids))
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16))


def _place_pairs(word: torch.Tensor) -> list[torch.Tensor]:
    """triton_kernels._place_pairs in torch (int64 words): the four bf16x2 bit patterns of a stored word."""
    m, s, sign = 0x81C081C0, 0xFFFFFFFF, 0x80008000
    return [word & m, (word << 3) & m & s, (word << 6) & m & s,
            ((word >> 4) & 0x00C000C0) | ((word >> 5) & 0x01000100) | ((word << 1) & sign)]


def test_the_kernel_places_every_code_at_every_position_of_a_word():
    """The kernel's shifts and masks against the stored bit positions (triton_bitplace.CODE_BITS): every one of
    the 16 codes in every one of the 8 slots of a word (and random words) comes out as the bf16 bits that
    place_e2m1 gives it, sign at 15 / 31 and magnitude at 6..8 / 22..24 of pair p's word."""
    from harness.backends.triton_bitplace import _scatter_bits, word_codes

    g = torch.Generator().manual_seed(0)
    same = torch.arange(16, dtype=torch.uint8)[:, None].expand(16, 8)  # code v in all slots
    rand = torch.randint(0, 16, (4096, 8), generator=g, dtype=torch.uint8)
    codes = torch.cat([same, rand])
    word = _scatter_bits(codes)
    assert torch.equal(word_codes(word.to(torch.int32).view(torch.uint8).reshape(-1, 4)).view(-1, 8), codes)
    placed = place_e2m1(codes).view(torch.int16).to(torch.int64) & 0xFFFF
    for p, got in enumerate(_place_pairs(word)):
        assert torch.equal(got & 0xFFFF, placed[:, p]), p
        assert torch.equal(got >> 16, placed[:, p + 4]), p


_SCALE_REGS_TILES = [dict(block_m=16, split_k=1), dict(block_m=16, split_k=3),
                     dict(block_m=32, split_k=1, block_n=128, num_warps=8)]
_SCALE_REGS_SCHEMES = [("w_nvfp4", "SWIGLUOAI"), ("w_nvfp4_a_nvfp4", "SILU"), ("w_mxfp4", "SILU")]


@pytest.mark.parametrize("tiles", _SCALE_REGS_TILES, ids=["one_split", "split_k_empty_splits", "eight_warps"])
@pytest.mark.parametrize("scheme,act", _SCALE_REGS_SCHEMES)
def test_scales_loaded_a_step_ahead_give_the_bits_of_the_pipelined_loads(scheme, act, tiles, monkeypatch,
                                                                         hypothesis_profile):
    """scale_regs 1 (the K loop's SCALE_REGS: each chunk's block scales loaded one step ahead into registers, the
    first before the loop, the last step reading its own chunk again) gives the outputs of scale_regs 0 bit for bit,
    both GEMMs, K with tails (H = 416: 4 chunks, the last a quarter; I = 96), N not a multiple of the tile, 3 splits
    of 2 chunks, the last empty; a loop that decoded a chunk with the next chunk's scales, or the first chunk's
    throughout, fails it.
    The GEMM launches are checked to carry the flag, so the prefetching loop is what ran. scale_regs is opt-in (the
    tile table does not take it): the ci profile runs each scheme with one tiling in turn (~6 s an interpreter case,
    55 s of make test's worker time for all 9); dev and nightly run all."""
    if hypothesis_profile == "ci" and _SCALE_REGS_TILES.index(tiles) != _SCALE_REGS_SCHEMES.index((scheme, act)):
        pytest.skip("ci profile: scale_regs (opt-in) runs each scheme with one tiling in turn (dev and nightly: all)")
    from harness.backends import triton_kernels as K
    from harness.backends.triton_bitplace import TritonBitplaceBackend
    from harness.core.conformance import Shape, backend_shape, case_checkpoint, case_inputs

    real, flags = K.moe_gemm_kernel, []

    class _Flags:  # runs each launch, recording its SCALE_REGS
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                flags.append(kwargs.get("SCALE_REGS", False))
                return real[grid](*args, **kwargs)
            return launch

    outs = []
    for scale_regs in (0, 1):
        flags.clear()
        monkeypatch.setattr(K, "moe_gemm_kernel", _Flags())
        backend = TritonBitplaceBackend().configure(block_k=128, num_stages=2, scale_regs=scale_regs,
                                                    **{"block_n": 64, "num_warps": 4, **tiles})
        shape = backend_shape(backend, Shape(num_experts=5, hidden_size=416, intermediate_size=96, tokens=9, top_k=3))
        ckpt = case_checkpoint(scheme, act, "e4m3fn", shape, seed=7, bias=True)
        x, w, ids = case_inputs(shape, 5)
        outs.append(backend.forward(backend.prepare(ckpt), x, w, ids))
        monkeypatch.undo()
        assert flags == [bool(scale_regs)] * 2, flags  # GEMM1 and GEMM2
    with pytest.raises(ValueError, match="scale_regs 1 takes mma_steps 1"):
        backend.configure(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=2, scale_regs=1, mma_steps=2)
        backend.forward(backend.prepare(ckpt), x, w, ids)
    assert outs[1].abs().sum() > 0
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16))


# ~2.8 s an example under the interpreter: the ci profile (make test, 2 cores) takes 4, dev and nightly more
@settings(max_examples=moe_property_examples(4 if settings.get_current_profile_name() == "ci" else 12), deadline=None)
@given(scheme=st.sampled_from(["w_mxfp4", "w_nvfp4", "w_nvfp4_a_nvfp4", "w_mxfp4_a_mxfp4"]),
       block_n=st.sampled_from([64, 128]), w2_block_n=st.sampled_from([0, 64, 128]),
       mma_steps=st.sampled_from([1, 2]), split_k=st.sampled_from([1, 2, 3]), hidden=st.sampled_from([128, 160, 288]),
       inter=st.sampled_from([96, 128, 160]), tokens=st.integers(1, 9), seed=st.integers(0, 2**16),
       row_pairs=st.booleans(), num_warps=st.sampled_from([4, 8]), serial_k=st.sampled_from([0, 1]),
       scale_regs=st.sampled_from([0, 1]))
def test_every_bitplace_tile_configuration_the_sweep_may_pick_is_exact(scheme, block_n, w2_block_n, mma_steps,
                                                                        split_k, hidden, inter, tokens, seed,
                                                                        row_pairs, num_warps, serial_k, scale_regs):
    """Each tile key of triton_bitplace that tools/tune_moe.py sweeps (block_n, w2_block_n, mma_steps, split_k,
    serial_k, scale_regs with mma_steps 1, num_warps: 8 takes 128-row tiles, REPS 2), in any combination, at K with
    and without tails, with either code
    layout (row_pairs), against the reference: whatever the next H200 sweep puts in BITPLACE_TILES has been checked
    here first (the layouts the warps get are the compiler's: the GPU's conformance run checks those)."""
    from harness.backends import backend_structure
    from harness.backends.triton_bitplace import TritonBitplaceBackend
    from harness.core.conformance import Shape, backend_shape, compare_backend, reference_run

    backend = TritonBitplaceBackend().configure(block_m=16, block_n=block_n, block_k=128, num_warps=num_warps,
                                                num_stages=2, w2_block_n=w2_block_n, mma_steps=mma_steps,
                                                split_k=split_k, serial_k=serial_k,
                                                scale_regs=scale_regs if mma_steps == 1 else 0)
    backend.row_pairs = row_pairs
    tiles = backend.tile_config(tokens * 3, None)
    assert tiles["num_warps"] == num_warps and tiles["block_n"] % (16 * num_warps) == 0
    shape = backend_shape(backend, Shape(num_experts=4, hidden_size=hidden, intermediate_size=inter, tokens=tokens,
                                         top_k=3))
    ckpt, inputs, out, trace = reference_run(scheme, "SWIGLUOAI", "e4m3fn", shape, seed, backend_structure(backend))
    assert backend.prepare(ckpt).constexprs.items() >= dict(BITPLACE=True, ROW_PAIRS=backend.row_pairs).items()
    result = compare_backend(backend, ckpt, inputs, out, trace, f"{scheme} tiles")
    assert result.ok, result.message()


def test_the_decode_row_splits_k_until_gemm1_fills_the_gpu(monkeypatch):
    """BITPLACE_TILES' decode row resolves split_k from GEMM1's programs (split_k_to_fill), as the H200 sweep chose
    (results/gpu-issue28/run-2): gpt-oss-120b at one token (4 experts x 45 tiles) 4 ways, Kimi-K2 (8 x 32) 2
    ways, neither at 8 tokens; forward launches what it resolved, and the table's row is not changed."""
    from harness.backends import triton_kernels
    from harness.backends.triton_bitplace import TritonBitplaceBackend
    from harness.backends.triton_emulation import split_k_to_fill
    from reference.quantizers import MX

    interpret = triton_kernels.INTERPRET
    monkeypatch.setattr(triton_kernels, "INTERPRET", False)  # the GPU's tile table
    backend = TritonBitplaceBackend()
    row = backend.tile_config(4, MX)
    for programs, split in ((4 * 45, 4), (8 * 32, 2), (32 * 45, 1), (64 * 32, 1), (1, 4)):
        tiles = split_k_to_fill(row, programs)
        assert tiles["split_k"] == split and "split_k_programs" not in tiles, (programs, tiles)
    assert backend.tile_config(4, MX) == row and "split_k" not in row  # resolved per launch, the row untouched
    assert "split_k_programs" not in backend.tile_config(2048, MX)  # prefill: never split
    monkeypatch.setattr(triton_kernels, "INTERPRET", interpret)  # the host's own kernels from here
    from harness.core.conformance import Shape, backend_shape, case_checkpoint, case_inputs

    # the row's rule with the count the forward computes: min(experts, pairs) x intermediate tiles = 3 x 2 = 6
    # programs, so 7 asks for 2 splits; counting all experts (8), the hidden size's tiles (12) or the pairs would
    # not split at all
    backend.tiles = dict(row, num_stages=2, split_k_programs=7)
    shape = backend_shape(backend, Shape(num_experts=4, hidden_size=256, intermediate_size=96, tokens=1, top_k=3))
    x, w, ids = case_inputs(shape, 1)
    backend.forward(backend.prepare(case_checkpoint("w_mxfp4", "SWIGLUOAI", "e4m3fn", shape, 1, True)), x, w, ids)
    assert [backend.last_launch[g][0][2] for g in ("w13", "w2")] == [2, 2]


def test_the_prefill_rows_are_chosen_by_weight_and_activation_kinds(monkeypatch):
    """BITPLACE_TILES' prefill rows by the checkpoint's (weight, activation) kinds: NVFP4 (W4A16 and W4A4,
    results/gpu-issue28/run-28 and run-30) on 8 warps and 128 weight rows, MXFP4 (any activations) on the catch-all;
    a row may name a (weight, activation) pair, which matches that scheme only; the 8-warp row only with a Triton that
    keeps its wgmma asynchronous (EIGHT_WARP_BITPLACE_TRITON). Every row is one the kernel can launch:
    K steps of one 128-value chunk, N tiles a multiple of 64 rows a warpgroup."""
    from harness.backends import triton_kernels
    from harness.backends.triton_bitplace import BITPLACE_TILES, TritonBitplaceBackend
    from harness.backends.triton_emulation import scheme_kinds, table_row_matches
    from reference.quantizers import MX, NVFP4
    from reference.schemes import scheme_by_name

    from harness.backends import triton_bitplace

    monkeypatch.setattr(triton_kernels, "INTERPRET", False)  # the GPU's tile table
    backend = TritonBitplaceBackend()
    assert scheme_kinds(scheme_by_name("w_nvfp4_a_nvfp4")) == (NVFP4, NVFP4)
    assert scheme_kinds(scheme_by_name("w_mxfp4")) == (MX, None)
    # NVFP4 on 8 warps with the Triton it was measured with, on 4 with one that serializes that loop's wgmma
    for version, warps_n in (((3, 6), (8, 128)), ((3, 9), (4, 64))):
        monkeypatch.setattr(triton_bitplace, "triton_version", lambda: version)
        rows = {name: backend.tile_config(8192 * 4, *scheme_kinds(scheme_by_name(name)))
                for name in ("w_mxfp4", "w_mxfp4_a_mxfp4", "w_nvfp4", "w_nvfp4_a_nvfp4")}
        assert (rows["w_nvfp4"]["num_warps"], rows["w_nvfp4"]["block_n"], rows["w_nvfp4"]["block_m"]) == (*warps_n, 128)
        assert rows["w_nvfp4_a_nvfp4"] == rows["w_nvfp4"]
    assert table_row_matches(((NVFP4, NVFP4),), NVFP4, NVFP4) and not table_row_matches(((NVFP4, NVFP4),), NVFP4, None)
    assert table_row_matches((NVFP4,), NVFP4, NVFP4) and not table_row_matches((NVFP4,), MX, None)
    assert rows["w_mxfp4"] == rows["w_mxfp4_a_mxfp4"] == BITPLACE_TILES[-1][2]
    assert backend.tile_config(16, NVFP4, None) == backend.tile_config(16, NVFP4, NVFP4) == BITPLACE_TILES[0][2]
    for _, _, row in BITPLACE_TILES:
        assert row["block_k"] == 128 and row["num_warps"] in (4, 8) and row["block_n"] % (16 * row["num_warps"]) == 0


def test_configure_starts_from_the_base_tiles_not_a_table_row_or_an_earlier_sweep_point(monkeypatch):
    """tools/tune_moe.py configures sweep point after sweep point and records only the keys it set: an optional
    key it leaves out must take the kernel's default, not the decode table row's split_k_programs nor the previous
    point's mma_steps / maxnreg / split_k (which would run unrecorded)."""
    from harness.backends import triton_kernels
    from harness.backends.triton_bitplace import BITPLACE_TILES, TritonBitplaceBackend
    from harness.backends.triton_emulation import TritonEmulationBackend

    monkeypatch.setattr(triton_kernels, "INTERPRET", False)  # the GPU's tile tables
    assert BITPLACE_TILES[0][2].get("split_k_programs"), "the decode row splits K at one token (the case this guards)"
    for backend in (TritonBitplaceBackend(), TritonEmulationBackend()):
        assert backend.configure(block_m=16, block_n=64, block_k=128, num_warps=4).tiles.get("split_k", 1) == 1
        backend.configure(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=4, split_k=4, mma_steps=2,
                          maxnreg=96, w2_block_n=128)
        tiles = backend.configure(block_m=64, block_n=64, block_k=128, num_warps=4, num_stages=3).tile_config(1, None)
        assert not {"split_k", "split_k_programs", "mma_steps", "maxnreg", "w2_block_n"} & set(tiles), (backend.name,
                                                                                                      tiles)
        assert tiles["num_stages"] == 3 and tiles["block_m"] == 64


def test_the_bit_for_bit_tool_reports_a_backend_one_ulp_off(monkeypatch, capsys, tmp_path):
    """tools/bit_for_bit.py (the GPU runs' smoke check): the same backend at the same split agrees bit for bit (exit
    0); a backend whose output differs from the reference's in one bf16 ulp of one element is reported at each point
    (the exit status counts them); so too against the outputs a --save run kept (--against, across processes)."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "tools"))
    import bit_for_bit

    argv = ["--model", "cpu", "--scheme", "w_mxfp4", "--tokens", "8", "--ref", "triton_bitplace", "--backend",
            "triton_bitplace", "--ref-config", "num_stages=2", "--config", "num_stages=2", "--sweep", "split_k=1,2"]
    assert bit_for_bit.main(argv) == 0
    assert capsys.readouterr().out.count("bit for bit True") == 2
    real = bit_for_bit.load_backend
    calls = []

    def one_ulp_off(name):
        backend = real(name)
        calls.append(name)
        if len(calls) == 2:  # the backend under test, not the reference
            forward = backend.forward

            def nudged(*args):
                out = forward(*args).clone()
                out.view(torch.int16).view(-1)[0] ^= 1
                return out
            backend.forward = nudged
        return backend
    monkeypatch.setattr(bit_for_bit, "load_backend", one_ulp_off)
    assert bit_for_bit.main(argv) == 2
    assert capsys.readouterr().out.count("bit for bit False") == 2
    # across processes: a --save run's outputs, then --against them (no reference backend run)
    monkeypatch.setattr(bit_for_bit, "load_backend", real)
    kept = str(tmp_path / "kept.pt")
    alone = ["--model", "cpu", "--scheme", "w_mxfp4", "--tokens", "8", "--backend", "triton_bitplace", "--config",
             "num_stages=2", "--sweep", "split_k=1,2"]
    assert bit_for_bit.main(alone + ["--save", kept]) == 0
    assert capsys.readouterr().out.count(": kept") == 2
    assert bit_for_bit.main(alone + ["--against", kept]) == 0
    assert capsys.readouterr().out.count("bit for bit True") == 2
    calls.clear()
    calls.append("(no reference loaded: the backend is the second load)")
    monkeypatch.setattr(bit_for_bit, "load_backend", one_ulp_off)
    assert bit_for_bit.main(alone + ["--against", kept]) == 2
    assert capsys.readouterr().out.count("bit for bit False") == 2


def _gluon_tile(box: torch.Tensor, f01: torch.Tensor, f23: torch.Tensor, halves: int = 0) -> torch.Tensor:
    """gluon_kernels._decode_tile in torch on its logical values (a Gluon layout moves no value): a code box
    [32 row pairs, 32 words] (int64 holding uint32) and the block factors [64 rows, 4 q] of pairs 0, 1 and 2, 3
    of word 4t + q (bf16 bits in both halves; halves 1 / 2: _tile_factor_halves' words, MX / NVFP4, each read in
    the half _scaled_by_factor_halves picks, its reshapes, permutes, splits and joins replayed) -> the tile's
    [64, 128] values (float64, exact)."""
    from harness.backends.gluon_kernels import DECODE_ORDER

    word = box.reshape(32, 2, 16).reshape(64, 16).reshape(64, 4, 4)
    w5 = word.reshape(4, 2, 8, 4, 4)
    f01, f23 = (f[:, None, :].expand(64, 4, 4).reshape(4, 2, 8, 4, 4) for f in (f01, f23))
    half = lambda p: ((p & 0xFFFF) << 16).to(torch.int32).view(torch.float32).double()  # noqa: E731

    def by_halves(p, f):  # _scaled_by_factor_halves: gl.split takes the last dim apart, gl.join makes a new last one
        p6, f6 = p.reshape(4, 2, 8, 4, 2, 2), f.reshape(4, 2, 8, 4, 2, 2)
        if halves == 1:
            p6, f6 = p6.transpose(-1, -2), f6.transpose(-1, -2)
        out = []
        for part in (lambda x: x, lambda x: x >> 16):  # the pair's low value, then its high value
            prods = [half(part(p6[..., h])) * half(f6[..., h] >> (16 * h)) for h in (0, 1)]
            joined = torch.stack(prods, -1)
            out.append((joined.transpose(-1, -2) if halves == 1 else joined).reshape(4, 2, 8, 4, 4))
        return out

    lo, hi = [], []
    for p, f in zip(_place_pairs(w5), (f01, f01, f23, f23)):  # each placed pair's halves times its factor (exact)
        if halves:
            low, high = by_halves(p, f)
            lo.append(low)
            hi.append(high)
        else:
            lo.append(half(p) * half(f))
            hi.append(half(p >> 16) * half(f))
    # join(join(join(lo0, lo2), join(lo1, lo3)), join(join(hi0, hi2), join(hi1, hi3))): new dims last
    joined = torch.stack([torch.stack([torch.stack([v[0], v[2]], -1), torch.stack([v[1], v[3]], -1)], -1)
                          for v in (lo, hi)], -1)
    return joined.permute(*DECODE_ORDER.value).reshape(64, 128)


def test_the_gluon_decode_reads_the_tma_boxes_of_every_tile_in_the_stored_order():
    """harness/backends/gluon_kernels.py (compiled only: Gluon has no interpreter) in torch, step for step: the TMA
    boxes the producer loads ([32 row pairs, 32 words] of the codes at (expert * N_ROWS / 2 + first row / 2,
    32 chunk), [1, 256] bytes of scales_by_chunk at (expert * chunks + chunk, 4 first row)), then _tile_factors
    and _decode_tile's reshapes, bit placement, factor, joins and permute, give the reference weights of the
    tile's 64 rows and 128 columns: every gate and up tile of two experts, every chunk, MX scales 0..128 (the
    fold's range)."""
    from harness.backends.gluon_kernels import scales_by_chunk
    from harness.backends.triton_bitplace import bitplace_scales, mma_order_codes, pair_rows

    experts, n_rows, k = 2, 128, 128 * 9  # gate rows 0..63, up rows 64..127 (N_OUT 64)
    g = torch.Generator().manual_seed(11)
    codes = torch.randint(0, 16, (experts, n_rows, k), generator=g, dtype=torch.uint8)
    scales = (torch.arange(experts * n_rows * k // 32) % (E8M0_FOLDABLE_MAX + 1)).to(torch.uint8)
    scales = scales[torch.randperm(scales.numel(), generator=g)].reshape(experts, n_rows, k // 32)
    want = torch.stack([dequantize_mx(codes[e], scales[e], E2M1) for e in range(experts)])
    chunks = k // 128
    w = pair_rows(mma_order_codes(pack_fp4(codes)), 64)
    ws = pair_rows(bitplace_scales(scales, True, 4), 4)
    code_words = w.view(experts * n_rows // 2, chunks * 128).view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    by_chunk = scales_by_chunk(ws, n_rows, chunks)
    for e in range(experts):
        for first in (0, 64):  # the gate tile, the up tile (g_col, u_col = g_col + N_OUT)
            for c in range(chunks):
                box = code_words[e * n_rows // 2 + first // 2:][:32, c * 32:(c + 1) * 32]
                sbox = by_chunk[e * chunks + c, first * 4:first * 4 + 256].view(64, 4)
                f = sbox.to(torch.int64) * 0x00800080
                # _tile_factor_halves (HALF_SELECT): the row's word, blocks 0, 2 and 1, 3 as the halves of two;
                # [64, 1, 2 j, 2 i] -> q = 2j + i holds word i
                w = sum(sbox[:, i].to(torch.int64) << (8 * i) for i in range(4))
                ev, od = (w << 7) & 0x7F807F80, (w >> 1) & 0x7F807F80
                fh = torch.stack([torch.stack([ev, ev], -1), torch.stack([od, od], -1)], -1).reshape(64, 4)
                for tile in (_gluon_tile(box, f, f), _gluon_tile(box, fh, fh, halves=1)):
                    bad = tile != want[e, first:first + 64, c * 128:(c + 1) * 128]
                    assert not bad.any(), (e, first, c, int(bad.sum()), tuple(bad.nonzero()[0].tolist()))


@pytest.mark.parametrize("per_chunk", [4, 8])
def test_the_tile_major_layout_holds_each_tma_box_of_the_pair_layout_as_one_contiguous_run(per_chunk):
    """tile_major_codes / tile_major_scales (the Gluon kernel's TILE_MAJOR): the 4 KB of codes and the 64 x per_chunk
    scale bytes of tile t, chunk c of expert e are exactly the pair layout's TMA boxes there ([32 row pairs, 32 words]
    at row pair e N / 2 + 32 t, word 32 c; scales_by_chunk's box at chunk row e chunks + c, byte 64 per_chunk t), and
    they lie at row (e N / 64 + t) chunks + c of the tile-major copies: a tile's K steps one run."""
    from harness.backends.gluon_kernels import scales_by_chunk, tile_major_codes, tile_major_scales

    g = torch.Generator().manual_seed(per_chunk)
    e, n, chunks = 3, 192, 5
    codes = torch.randint(0, 256, (e, n, chunks * 64), generator=g, dtype=torch.uint8)
    scales = torch.randint(0, 256, (e, n, chunks * per_chunk), generator=g, dtype=torch.uint8)
    pair_boxes = codes.view(e * n // 2, chunks * 128).view(torch.int32)
    by_chunk = scales_by_chunk(scales, n, chunks, per_chunk)
    tm_codes, tm_scales = tile_major_codes(codes), tile_major_scales(scales, per_chunk)
    assert tm_codes.shape == (e * n // 64 * chunks * 32, 32) and tm_codes.is_contiguous()
    rows = per_chunk // 4  # 256-byte rows a tile's chunk of scales
    for ei in range(e):
        for t in range(n // 64):
            for c in range(chunks):
                at = (ei * (n // 64) + t) * chunks + c
                assert torch.equal(tm_codes[32 * at:32 * at + 32],
                                   pair_boxes[ei * n // 2 + 32 * t:ei * n // 2 + 32 * t + 32, 32 * c:32 * c + 32])
                assert torch.equal(tm_scales[rows * at:rows * at + rows].reshape(-1),
                                   by_chunk[ei * chunks + c, 64 * per_chunk * t:64 * per_chunk * (t + 1)])
    with pytest.raises(ValueError, match="64-row tiles"):
        tile_major_codes(codes[:, :96])


def test_the_gluon_nvfp4_decode_reads_its_512_byte_scale_boxes_in_block_order():
    """The NVFP4 path of gluon_kernels in torch: the scale box of a 64-row tile is 2 rows of 256 bytes of
    scales_by_chunk(.., 8) seen as [-1, 256], at row (expert * chunks + chunk) * N_ROWS / 32 + first row / 32
    (_scale_box_at), read as [64 rows, 2 words]; _nvfp4_factor_words gives the factors of blocks 4w .. 4w + 3 of
    word w, joined (d0, d2) and (d1, d3) into the factors of pairs 0, 1 (block 2q) and 2, 3 (block 2q + 1): the
    reference weights x 2^-7 (the fold prepare() returns to the expert scale), every E4M3 code but NaN, every gate
    and up tile of two experts, every chunk."""
    from harness.backends.gluon_kernels import NVFP4_SCALE_BOX, scales_by_chunk
    from harness.backends.triton_bitplace import bitplace_scales, mma_order_codes, pair_rows
    from reference.formats import decode
    from reference.nvfp4 import dequantize_nvfp4

    experts, n_rows, k = 2, 128, 128 * 5
    g = torch.Generator().manual_seed(12)
    codes = torch.randint(0, 16, (experts, n_rows, k), generator=g, dtype=torch.uint8)
    finite = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)
    scales = finite[torch.randint(0, finite.numel(), (experts, n_rows, k // 16), generator=g)]
    want = dequantize_nvfp4(codes, scales, torch.tensor(1.0), torch.float64) * 2.0**-7
    chunks = k // 128
    w = pair_rows(mma_order_codes(pack_fp4(codes)), 64)
    ws = pair_rows(bitplace_scales(scales, False, 8), 8)
    code_words = w.view(experts * n_rows // 2, chunks * 128).view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    rows256 = scales_by_chunk(ws, n_rows, chunks, 8).view(-1, 256)

    def factor(byte):  # the E4M3 scale x 2^119 as bf16 bits in both halves (exact: _nvfp4_factor_words' value)
        bits = (decode(byte, E4M3FN).double() * 2.0**119).float().view(torch.int32).to(torch.int64) >> 16
        return (bits & 0xFFFF) * 0x00010001

    for e in range(experts):
        for first in (0, 64):
            for c in range(chunks):
                box = code_words[e * n_rows // 2 + first // 2:][:32, c * 32:(c + 1) * 32]
                at = (e * chunks + c) * (n_rows // 32) + first // 32
                sbox = rows256[at:at + NVFP4_SCALE_BOX[0]].reshape(64, 8)  # row r's 8 bytes: blocks 0..7
                d = [factor(sbox[:, j::4]) for j in range(4)]  # d_j[:, w]: block 4w + j
                f01 = torch.stack([d[0], d[2]], -1).reshape(64, 4)  # q = 2w + jj: block 2q
                f23 = torch.stack([d[1], d[3]], -1).reshape(64, 4)  # block 2q + 1
                # _tile_factor_halves (HALF_SELECT): word w's even (blocks 4w, 4w + 2) and odd (4w + 1, 4w + 3)
                # halves, each joined with itself: q = 2w + j
                even = (d[0] & 0xFFFF) | (d[2] & 0xFFFF) << 16
                odd = (d[1] & 0xFFFF) | (d[3] & 0xFFFF) << 16
                h01, h23 = (torch.stack([x, x], -1).reshape(64, 4) for x in (even, odd))
                for tile in (_gluon_tile(box, f01, f23), _gluon_tile(box, h01, h23, halves=2)):
                    bad = tile != want[e, first:first + 64, c * 128:(c + 1) * 128]
                    assert not bad.any(), (e, first, c, int(bad.sum()), tuple(bad.nonzero()[0].tolist()))


def test_gemm1_prefetches_its_weights_before_its_wait_only_where_the_ids_rank_its_blocks(monkeypatch):
    """w13_prefetch (GEMM1's PDL 3): the launch gets the call's flat expert ids and the chunk count only for GEMM1,
    launched as a dependent (pdl 1), on the plain grid, at most 16 tokens (where each expert has one block at most
    and a block's expert is the rank of the distinct ids); launch_bitplace_partials refuses it by name elsewhere."""
    from harness.backends import gluon_kernels
    from harness.backends import triton_kernels as K
    from harness.backends.triton_bitplace import TritonBitplaceGluonBackend
    from harness.backends.triton_emulation import scheme_kinds
    from reference.checkpoints import make_checkpoint

    monkeypatch.setattr(K, "INTERPRET", False)
    gluon = TritonBitplaceGluonBackend()
    gluon.device = "cpu"
    prep = gluon.prepare(make_checkpoint("w_mxfp4", "SWIGLUOAI", 2, 256, 128, seed=0, with_bias=True))
    seen = []
    monkeypatch.setattr(gluon_kernels, "launch_bitplace_partials",
                        lambda *args, **kwargs: seen.append((args[-2], kwargs.get("prefetch"), kwargs.get("tile_major"))))
    decode = dict(block_m=16, block_n=64, num_warps=4, num_stages=4, w13_prefetch=4)
    ids = torch.tensor([1, 0, 0, 1])

    def launch(which, tiles, tokens=2):
        seen.clear()
        gluon._partials_kernel(prep, which, 0, tiles, None, 128, 256, 256)(
            torch.zeros(tokens, 256, dtype=torch.bfloat16), None, None, None, tokens * 2, 2, 128, 256, 256,
            which == "w13", 1, ids=ids.repeat(tokens // 2))
        (pdl, prefetch, tile_major), = seen
        assert (tile_major is not None) == bool(tiles.get("tile_major")) and (
            tile_major is None or tile_major is prep.extras[f"{which}_tile_major"]), (which, tiles)
        return pdl, None if prefetch is None else (prefetch[0].tolist(), prefetch[1])

    assert launch("w13", dict(decode, pdl=1)) == (1, ([1, 0, 0, 1], 4))
    assert launch("w13", dict(decode, pdl=1), tokens=16)[1] is not None
    assert launch("w13", dict(decode, pdl=1), tokens=18) == (1, None)  # an expert may hold 17 pairs: 2 blocks
    assert launch("w2", dict(decode, pdl=1)) == (2, None)
    assert launch("w13", dict(decode, pdl=0)) == (0, None)
    assert launch("w13", dict(decode, pdl=1, persistent=1))[1] is None
    assert launch("w13", dict(decode, pdl=1, w13_prefetch=0)) == (1, None)
    # tile_major: both GEMMs get the prepared tile-major copy (launch checks which), the prefetch as before
    assert launch("w13", dict(decode, pdl=1, tile_major=1)) == (1, ([1, 0, 0, 1], 4))
    assert launch("w2", dict(decode, pdl=1, tile_major=1)) == (2, None)
    assert gluon.tile_config(2, *scheme_kinds(prep.ckpt.scheme))["tile_major"] == 1  # the table's decode row
    # the table's decode row: w13_prefetch where GEMM1's weights of the call (one expert a pair at most) fit
    # GLUON_W13_PREFETCH_BYTES (gpt-oss-120b one token: 35 MB), else none
    from harness.backends import triton_bitplace

    def resolved(pairs):
        return gluon.resolve_tiles(gluon.tile_config(pairs, *scheme_kinds(prep.ckpt.scheme)), prep, pairs, "cpu")

    per_expert = prep.w13[0].numel() + prep.w13_scale[0].numel()
    monkeypatch.setattr(triton_bitplace, "GLUON_W13_PREFETCH_BYTES", 2 * per_expert)
    assert resolved(2)["w13_prefetch"] == triton_bitplace.GLUON_W13_PREFETCH and "w13_prefetch_bytes" not in resolved(2)
    monkeypatch.setattr(triton_bitplace, "GLUON_W13_PREFETCH_BYTES", 2 * per_expert - 1)
    assert "w13_prefetch" not in resolved(2) and "w13_prefetch" in resolved(1)
    monkeypatch.undo()
    codes = torch.zeros(2, 256, 128, dtype=torch.uint8)
    for kwargs, named in ((dict(gated=False, pdl=2), "gated"), (dict(gated=True, pdl=0), "pdl 0"),
                          (dict(gated=True, pdl=1, tokens=17), "at most 16 tokens")):
        with pytest.raises(ValueError, match=named):
            gluon_kernels.launch_bitplace_partials(
                None, codes, None, torch.zeros(kwargs.pop("tokens", 2), 256, dtype=torch.bfloat16), None, None, None,
                4, 2, 128, 256, 256, kwargs["gated"], 1, 4, 80, pdl=kwargs["pdl"], prefetch=(ids, 4))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a Gluon kernel: runs compiled on a GPU only")
def test_gemm1_ranks_each_blocks_expert_from_the_ids_as_the_routing_launch_lays_the_blocks_out():
    """_block_expert_by_rank, compiled and run (GEMM1's PDL 3 guess of its block's expert before its wait): at 1 to
    16 tokens, top-k 1 to 8, experts 8 to 384, ids as int32 and int64, it gives every block (and the blocks past the
    used ones: -1) the expert moe_align_kernel's torch oracle gives it."""
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    from harness.backends.gluon_kernels import _block_expert_by_rank
    from harness.backends.triton_emulation import TritonEmulationBackend

    @gluon.jit
    def rank_kernel(ids_ptr, n_pairs, out_ptr, P: gl.constexpr):
        expert = _block_expert_by_rank(ids_ptr, n_pairs, gl.program_id(0), P)
        gl.store(out_ptr + gl.program_id(0), expert)

    g = torch.Generator().manual_seed(0)
    for tokens, top_k, experts in ((1, 4, 128), (1, 8, 384), (2, 1, 8), (3, 2, 8), (8, 4, 128), (16, 8, 384),
                                   (16, 8, 8), (5, 6, 16), (16, 1, 384)):
        ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)])
        _, block_expert = TritonEmulationBackend._align_torch(ids, experts, 16)
        for dtype in (torch.int32, torch.int64):
            n = ids.numel()
            out = torch.full((block_expert.numel(),), -7, dtype=torch.int32, device="cuda")
            rank_kernel[(block_expert.numel(),)](ids.to(dtype).cuda().reshape(-1), n, out,
                                                 P=max(16, 1 << (n - 1).bit_length()), num_warps=4)
            assert out.cpu().tolist() == block_expert.cpu().tolist(), (tokens, top_k, experts, dtype)


def test_the_gluon_decode_rows_follow_the_one_wave_rule(monkeypatch):
    """triton_bitplace_gluon's rows a program where a GEMM's 64-row grid is one wave (one_wave_block_n), at the H200's
    132 multiprocessors and the model shapes of run-12's one-token sweep: Kimi-K2's GEMM1 at 128 rows split 2 (the
    fastest there), gpt-oss-120b's both GEMMs at 64 (likewise); from 8 tokens on, and wherever a sweep fixes the tiles,
    the defaults stay. A 1.25x gain is not taken, 1.5x is. The pdl rule beside it (run-12's pdl sweep)."""
    from types import SimpleNamespace

    from harness.backends import triton_kernels
    from harness.backends.triton_bitplace import (GLUON_W2_BLOCK_N, TritonBitplaceGluonBackend, gluon_programs_per_sm,
                                                  one_wave_block_n)
    from reference.quantizers import MX

    assert (gluon_programs_per_sm(64), gluon_programs_per_sm(128)) == (3, 2)  # 80 registers: 256 / 384 threads
    monkeypatch.setattr(triton_kernels, "INTERPRET", False)  # the GPU's tile table
    backend = TritonBitplaceGluonBackend()
    # and the dependent launches: GEMM2 prefetching its weights (pdl 1) where they are at most 25 MB (gpt-oss-120b one
    # token: 4 experts x 4.1 MB of codes), else without the prefetch (pdl 2)
    for (experts, inter, hidden, top_k, tokens), want in {
            (128, 2880, 2880, 4, 1): (64, 2, 64, 1), (384, 2048, 7168, 8, 1): (128, 2, GLUON_W2_BLOCK_N, 2),
            (128, 2880, 2880, 4, 8): (64, 1, GLUON_W2_BLOCK_N, 2), (384, 2048, 7168, 8, 8): (64, 1, GLUON_W2_BLOCK_N, 2)
    }.items():
        p = tokens * top_k
        prep = SimpleNamespace(ckpt=SimpleNamespace(num_experts=experts, intermediate_size=inter, hidden_size=hidden),
                               w2=torch.zeros(1, hidden * inter // 2, dtype=torch.uint8), w2_scale=None,
                               w13=torch.zeros(1, hidden * inter, dtype=torch.uint8),
                               w13_scale=torch.zeros(1, hidden * inter // 16, dtype=torch.uint8))
        monkeypatch.setattr(triton_kernels, "INTERPRET", False)  # the GPU's rules (the interpreter turns pdl off)
        tiles = backend.resolve_tiles(backend.tile_config(p, MX), prep, p, "cpu")
        assert (tiles["block_n"], tiles["split_k"], tiles["w2_block_n"], tiles["pdl"]) == want, (experts, tokens, tiles)
        assert "one_wave_rows" not in tiles and "split_k_programs" not in tiles and "pdl_bytes" not in tiles
        # GEMM1's prefetch before its wait where its weights of the call fit: gpt-oss-120b one token (35 MB) only
        assert ("w13_prefetch" in tiles) == (inter == 2880 and tokens == 1), (experts, tokens, tiles)
    fixed = backend.configure(block_m=16, block_n=64, split_k=1)  # a sweep's tiles are what it asked for
    assert fixed.resolve_tiles(fixed.tile_config(8, MX), prep, 8, "cpu")["block_n"] == 64
    assert fixed.resolve_tiles(fixed.tile_config(8, MX), prep, 8, "cpu")["pdl"] == 0
    # one expert of 70 64-row tiles split 4 ways: 280 programs, 280 warpgroups; 35 128-row tiles split 5 ways: 175
    # programs, 350 warpgroups (1.25x: not taken), split 6 ways: 210 programs, 420 (1.5x: taken), split 8 ways: 280
    # programs, past the 264 that fit
    for split128, want in ((5, 64), (6, 128), (8, 64)):
        assert one_wave_block_n(1, 70 * 64, 132, lambda n: 4 if n == 70 else split128) == want, split128
    assert one_wave_block_n(7, 100 * 64, 132, lambda _: 1) is None  # 700 64-row programs: beyond one wave


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the prefill rows are the GPU's tile table: a GPU only (the "
                    "interpreter keeps its own small tiles)")
@pytest.mark.parametrize("kernel,gluon_prefill", [("triton_bitplace", False), ("triton_bitplace_gluon", False),
                                                        ("triton_bitplace_gluon", True)])
@pytest.mark.parametrize("scheme,act", [("w_mxfp4", "SWIGLUOAI"), ("w_nvfp4", "SILU"), ("w_nvfp4_a_nvfp4", "SWIGLUOAI")])
def test_the_prefill_rows_pass_conformance_past_the_fused_routing(kernel, gluon_prefill, scheme, act,
                                                                   monkeypatch):
    """The tile table's prefill rows (more than FUSED_ALIGN_MAX_PAIRS pairs: align_layouts' routing, 64- and 128-row
    blocks, tail blocks; with gluon_prefill the Gluon kernel's prefill blocks) against the reference, judged by the
    conformance bound: no shape class reaches this many pairs (the largest has 514), so without this case the
    prefill kernels are checked on the GPU only by tools/bit_for_bit.py runs."""
    from harness.backends import backend_structure, load_backend, triton_bitplace
    from harness.backends.triton_emulation import FUSED_ALIGN_MAX_PAIRS
    from harness.core.conformance import Shape, backend_shape, compare_backend, reference_run

    monkeypatch.setattr(triton_bitplace, "GLUON_PREFILL", gluon_prefill)
    backend = load_backend(kernel)
    shape = backend_shape(backend, Shape(num_experts=8, hidden_size=256, intermediate_size=320, tokens=600, top_k=2))
    assert shape.tokens * shape.top_k > FUSED_ALIGN_MAX_PAIRS
    ckpt, inputs, out, trace = reference_run(scheme, act, "e4m3fn", shape, 3, backend_structure(backend))
    result = compare_backend(backend, ckpt, inputs, out, trace, f"prefill/{scheme}/{kernel}")
    assert result.ok, result.message()
    if gluon_prefill:  # the Gluon kernel computed both GEMMs
        assert backend.last_launch["w13"][1].get("gluon_prefill") == 1, backend.last_launch


def test_the_gluon_prefill_blocks_take_the_whole_k_and_the_epilogue_in_one_launch(monkeypatch):
    """triton_bitplace_gluon's prefill row (the tiles' gluon_prefill; MOE_CONFORMANCE_GLUON_PREFILL=1 makes it the
    table's): blocks of 32-128 pairs go to bitplace_partials_kernel unsplit, with a 4-warp producer, the consumers'
    share of the register cap, the grid's group order and the epilogue's operands (direct); split-K, 256-pair blocks
    or the key off go to moe_gemm_kernel. The kernel itself runs on sm90 only (results/gpu-issue28/run-36)."""
    from harness.backends import gluon_kernels, triton_bitplace
    from harness.backends import triton_kernels as K
    from harness.backends.triton_bitplace import TritonBitplaceGluonBackend
    from reference.checkpoints import make_checkpoint
    from reference.quantizers import MX

    monkeypatch.setattr(K, "INTERPRET", False)  # prepare() then lays out the kernel's copies; the GPU's tile table
    gluon = TritonBitplaceGluonBackend()
    gluon.device = "cpu"
    prep = gluon.prepare(make_checkpoint("w_mxfp4", "SWIGLUOAI", 2, 256, 128, seed=0, with_bias=True))
    tiles = dict(triton_bitplace.GLUON_PREFILL_TILES, tile_major=1)
    launch = gluon_kernels.launch_bitplace_partials
    seen = []
    monkeypatch.setattr(gluon_kernels, "launch_bitplace_partials", lambda *args, **kwargs: seen.append(kwargs))
    run = gluon._partials_kernel(prep, "w13", 0, tiles, None, 128, 256, 256)
    assert run is not None and run.direct
    for other in (dict(tiles, split_k=2), dict(tiles, block_m=256), dict(tiles, gluon_prefill=0)):
        assert gluon._partials_kernel(prep, "w13", 0, other, None, 128, 256, 256) is None, other
    assert not gluon._partials_kernel(prep, "w13", 0, dict(tiles, block_m=16), None, 128, 256, 256).direct  # decode
    run(torch.zeros(2, 256, dtype=torch.bfloat16), None, None, None, 2, 1, 128, 256, 256, True, 1,
        direct=dict(final_ptr="the output"))
    # 168 registers a thread over 3 warpgroups: the producer 56, each consumer (504 - 56) / 2 = 224
    assert seen[-1]["bm"] == 64 and seen[-1]["producer"] == (4, 56, 224) and seen[-1]["group_m"] == 8, seen[-1]
    assert seen[-1]["direct"] == dict(final_ptr="the output") and "tile_major" in seen[-1], seen[-1]
    # the table's prefill row: only with the switch; decode rows untouched by it
    monkeypatch.setattr(triton_bitplace, "GLUON_PREFILL", False)
    assert "gluon_prefill" not in gluon.tile_config(8192, MX)
    monkeypatch.setattr(triton_bitplace, "GLUON_PREFILL", True)
    assert gluon.tile_config(8192, MX)["gluon_prefill"] == 1
    assert gluon.tile_config(16, MX)["block_m"] == 16 and "gluon_prefill" not in gluon.tile_config(16, MX)
    with pytest.raises(ValueError, match="direct"):  # the launch refuses what the kernel cannot do
        launch(None, None, None, None, None, None, None, 2, 1, 128, 256, 256, True, 2, 4, 168, bm=64,
               direct=dict(final_ptr=None))
    with pytest.raises(ValueError, match="bm"):
        launch(None, None, None, None, None, None, None, 2, 1, 128, 256, 256, True, 1, 4, 168, bm=64, pdl=1)
    # a 4-warp producer on the persistent grid (whose ring counts one producer warp's arrivals), and register splits
    # setmaxnreg cannot give: 176 x 384 threads over the multiprocessor's 65536, a second consumer past 256
    for kwargs, match in ((dict(producer=(4, 56, 224), persistent=132, bm=16), "4-warp producer partition"),
                          (dict(producer=(4, 56, 240), tiles=2, maxnreg=176), "65536"),
                          (dict(producer=(4, 56, 264), tiles=2), "second consumer registers 264"),
                          (dict(producer=(4, 20, 224), tiles=2), "producer registers 20")):
        args = dict(stages=4, maxnreg=168, bm=64, direct=dict(final_ptr=None)) | kwargs
        if args.get("persistent"):
            del args["direct"]
        with pytest.raises(ValueError, match=match):
            launch(None, None, None, None, None, None, None, 2, 1, 128, 256, 256, True, 1, **args)


def test_a_direct_partials_kernel_writes_the_outputs_and_no_epilogue_follows(monkeypatch):
    """_gemm with a subclass kernel that finishes its tiles (the callable's direct): the kernel gets the GEMM's output
    and the epilogue's operands, no fp32 partial-sums buffer is made and no split-K epilogue kernel launches; GEMM1's
    NVFP4 quantization of GEMM2's input is reported done (W4A4). A stand-in kernel writes the reference's GEMM
    outputs, so the forward's answer shows the outputs went where the rest of the pipeline reads them."""
    from harness.backends import triton_kernels as K
    from harness.backends.triton_emulation import TritonEmulationBackend
    from harness.core.conformance import Shape, case_checkpoint, case_inputs

    calls = []

    class Direct(TritonEmulationBackend):
        def _partials_kernel(self, prep, which, a_mode, tiles, quantize_nvfp4, n_out, n_rows, k_dim):
            def run(a, partials, sorted_rows, block_expert, n_pairs, a_row_div, n_out, n_rows, k_dim, gated, split_k,
                    serial=None, ids=None, direct=None):
                calls.append((which, partials, direct))
                direct["final_ptr"].fill_(0.5 if which == "w13" else 0.25)
            run.direct = True
            return run

    launched = []
    never = type("Never", (), {"__getitem__": lambda self, grid: launched.append(grid)})()
    monkeypatch.setattr(K, "splitk_epilogue_kernel", never)
    backend = Direct().configure(block_m=64, block_n=64, block_k=64, num_warps=4, num_stages=2)
    shape = Shape(num_experts=4, hidden_size=64, intermediate_size=32, tokens=520, top_k=2)  # 1040 pairs: prefill
    x, w, ids = case_inputs(shape, 1)
    prep = backend.prepare(case_checkpoint("w_mxfp4", "SILU", "e4m3fn", shape, 1, False))
    out = backend.forward(prep, x, w, ids)
    assert [c[0] for c in calls] == ["w13", "w2"] and not launched
    for which, partials, direct in calls:
        assert partials is direct["final_ptr"] and partials.dtype == torch.bfloat16, which  # no fp32 partial sums
        assert direct["QUANT_NVFP4"] is False and "count_ptr" not in direct
    # every pair's GEMM2 row 0.25, summed with the token's two routing weights (the top-k sum after GEMM2)
    want = (0.25 * w.float().sum(-1, keepdim=True)).expand(-1, shape.hidden_size)
    assert torch.allclose(out.float(), want, rtol=2 ** -7), (out - want).abs().max()


def test_the_gluon_gemm_takes_exactly_the_launches_its_contract_covers(monkeypatch):
    """triton_bitplace_gluon's dispatch (the kernel itself runs on sm90 only): MXFP4 x bf16 GEMMs of 16-pair blocks
    whose TMA boxes fit go to bitplace_partials_kernel; activation scales and NVFP4 quantization (unless switched
    off), quantized activations of any kind (likewise), prefill blocks, K not
    a multiple of 16, odd N, small N_ROWS, N tiles other than one or two warpgroups' 64 rows and 8-warp tiles go
    to moe_gemm_kernel; triton_bitplace without the switch never."""
    from harness.backends import triton_kernels as K
    from harness.backends.triton_bitplace import GLUON_MAXNREG, TritonBitplaceBackend, TritonBitplaceGluonBackend
    from reference.checkpoints import make_checkpoint

    monkeypatch.setattr(K, "INTERPRET", False)  # prepare() then lays out the kernel's per-chunk scale copy
    ckpt = make_checkpoint("w_mxfp4", "SWIGLUOAI", 2, 256, 128, seed=0, with_bias=True)
    gluon, plain = TritonBitplaceGluonBackend(), TritonBitplaceBackend()
    gluon.device = plain.device = "cpu"
    prep = gluon.prepare(ckpt)
    assert set(prep.extras) == {"w13_scale_by_chunk", "w2_scale_by_chunk", "w13_tile_major", "w2_tile_major"}
    assert not plain.prepare(ckpt).extras
    decode = dict(block_m=16, block_n=64, num_warps=4, num_stages=4)
    prefill = dict(decode, block_m=64)
    from harness.backends import triton_bitplace

    monkeypatch.setattr(triton_bitplace, "GLUON_QUANTIZED_ACT", False)  # first without quantized activations
    takes = lambda tiles, n_out=128, n_rows=256, k=256, a_mode=0, quant=None: gluon._partials_kernel(  # noqa: E731
        prep, "w13", a_mode, tiles, quant, n_out, n_rows, k) is not None
    assert takes(decode) and gluon._partials_kernel(prep, "w2", 0, decode, None, 256, 256, 128) is not None
    assert takes(dict(decode, block_n=128))  # two consumer warpgroups a program
    assert not any([takes(prefill), takes(decode, a_mode=1), takes(decode, quant=torch.ones(1)), takes(decode, k=264),
                    takes(decode, n_out=127), takes(decode, n_rows=254), takes(decode, n_rows=32),
                    takes(dict(decode, block_n=256)), takes(dict(decode, num_warps=8))])
    assert plain._partials_kernel(plain.prepare(ckpt), "w13", 0, decode, None, 128, 256, 256) is None
    # quantized activations (one fp32 scale, the epilogue's; GEMM1's NVFP4 quantization of GEMM2's input): the
    # default (MOE_CONFORMANCE_GLUON_QUANTIZED_ACT=0 turns them off)
    monkeypatch.setattr(triton_bitplace, "GLUON_QUANTIZED_ACT", True)
    assert takes(decode, a_mode=1) and takes(decode, quant=torch.ones(1)) and not takes(decode, a_mode=2)
    w4a4 = gluon.prepare(make_checkpoint("w_nvfp4_a_nvfp4", "SWIGLUOAI", 2, 256, 128, seed=0, with_bias=True))
    assert gluon._partials_kernel(w4a4, "w13", 1, decode, torch.ones(1), 128, 256, 256) is not None
    monkeypatch.setattr(triton_bitplace, "GLUON_QUANTIZED_ACT", False)
    assert gluon._partials_kernel(w4a4, "w13", 0, decode, None, 128, 256, 256) is None  # its activations: quantized
    # the launch parameters each GEMM's launch takes: GEMM2's schedule and N tile where they differ from GEMM1's
    from harness.backends import gluon_kernels

    seen = []
    monkeypatch.setattr(gluon_kernels, "launch_bitplace_partials", lambda *args: seen.append(args[-7:-1]))
    for pdl in (0, 1, 2):  # pdl 1: GEMM1 waits at entry (mode 1), GEMM2 prefetches first (mode 2); pdl 2: both 1
        tiles = dict(decode, num_stages=3, mma_overlap=1, w2_mma_overlap=2, w2_block_n=128, pdl=pdl)
        for which in ("w13", "w2"):
            run = gluon._partials_kernel(prep, which, 0, tiles, None, 128, 256, 256)
            run(torch.zeros(2, 256, dtype=torch.bfloat16), None, None, None, 2, 1, 128, 256, 256, which == "w13", 1)
    assert seen == [(3, GLUON_MAXNREG, 1, 1, 0, 0), (3, GLUON_MAXNREG, 2, 2, 0, 0),
                    (3, GLUON_MAXNREG, 1, 1, 0, 1), (3, GLUON_MAXNREG, 2, 2, 0, 2),
                    (3, GLUON_MAXNREG, 1, 1, 0, 1), (3, GLUON_MAXNREG, 2, 2, 0, 1)], seen
    # a persistent grid: the programs that fit at once (80 registers: 3 a multiprocessor at 64 rows, 2 at 128; the
    # 3-slot rings fit 5 or more), 132 multiprocessors where no GPU answers; schedule 0 only (GEMM1's here)
    monkeypatch.setattr(gluon_kernels, "launch_bitplace_partials", lambda *args: seen.append(args[-7:]))
    tiles = dict(decode, num_stages=3, mma_overlap=0, w2_mma_overlap=1, w2_block_n=128, persistent=1)
    for which in ("w13", "w2"):
        run = gluon._partials_kernel(prep, which, 0, tiles, None, 128, 256, 256)
        run(torch.zeros(2, 256, dtype=torch.bfloat16), None, None, None, 2, 1, 128, 256, 256, which == "w13", 1)
    assert seen[-2:] == [(3, GLUON_MAXNREG, 0, 1, 0, 0, 3 * 132), (3, GLUON_MAXNREG, 1, 2, 0, 0, 0)], seen[-2:]
    # NVFP4 W4A16 (8 scale bytes a row and chunk, read as 256-byte box rows; MOE_CONFORMANCE_GLUON_NVFP4=0 turns
    # it off): N_ROWS and N_OUT multiples of 32

    nv = make_checkpoint("w_nvfp4", "SWIGLUOAI", 2, 256, 128, seed=0, with_bias=True)
    monkeypatch.setattr(triton_bitplace, "GLUON_NVFP4", False)
    assert gluon._partials_kernel(gluon.prepare(nv), "w13", 0, decode, None, 128, 256, 256) is None
    monkeypatch.setattr(triton_bitplace, "GLUON_NVFP4", True)
    monkeypatch.setattr(triton_bitplace, "NVFP4_EXPONENT_ADD", True)
    nv_prep = gluon.prepare(nv)
    assert nv_prep.extras["w13_scale_by_chunk"].shape == (2 * 2, 256 * 8)
    assert gluon._partials_kernel(nv_prep, "w13", 0, decode, None, 128, 256, 256) is not None
    assert gluon._partials_kernel(nv_prep, "w13", 0, decode, None, 112, 224, 256) is None  # 112 rows: 3.5 x 32
    gluon._partials_kernel(nv_prep, "w2", 0, decode, None, 256, 256, 128)(
        torch.zeros(2, 128, dtype=torch.bfloat16), None, None, None, 2, 1, 256, 256, 128, False, 1)
    assert seen[-1][-3] == 3, seen  # W_NV 3: every scale positive and normal, stored biased
    monkeypatch.setattr(triton_bitplace, "NVFP4_BIASED_SCALES", False)
    gluon._partials_kernel(gluon.prepare(nv), "w2", 0, decode, None, 256, 256, 128)(
        torch.zeros(2, 128, dtype=torch.bfloat16), None, None, None, 2, 1, 256, 256, 128, False, 1)
    assert seen[-1][-3] == 2, seen  # W_NV 2: every scale normal, the factors by an exponent add
    import dataclasses

    nv_low = dataclasses.replace(nv, w2=dataclasses.replace(nv.w2, scale=nv.w2.scale.clone().fill_(0x05)))
    gluon._partials_kernel(gluon.prepare(nv_low), "w2", 0, decode, None, 256, 256, 128)(
        torch.zeros(2, 128, dtype=torch.bfloat16), None, None, None, 2, 1, 256, 256, 128, False, 1)
    assert seen[-1][-3] == 1, seen  # a subnormal scale: the multiplies


def test_a_table_row_override_from_the_environment_is_key_int_pairs_or_a_clear_error(monkeypatch):
    """triton_bitplace.env_tiles (MOE_CONFORMANCE_NVFP4_PREFILL_TILES: make bench A/B runs of the NVFP4 prefill rows):
    "key=int,key=int" gives those keys, unset or empty none, anything else (or a key that is no launch parameter) an
    error naming the variable; a key the rows have is overridden, not doubled."""
    from harness.backends.triton_bitplace import env_tiles

    monkeypatch.delenv("MOE_CONFORMANCE_TEST_TILES", raising=False)
    assert env_tiles("MOE_CONFORMANCE_TEST_TILES") == {}
    monkeypatch.setenv("MOE_CONFORMANCE_TEST_TILES", " tail_warps=4, tail_block_n=64 ")
    assert env_tiles("MOE_CONFORMANCE_TEST_TILES") == dict(tail_warps=4, tail_block_n=64)
    for bad in ("tail_warps", "tail_warps=four"):
        monkeypatch.setenv("MOE_CONFORMANCE_TEST_TILES", bad)
        with pytest.raises(ValueError, match="MOE_CONFORMANCE_TEST_TILES takes key=int pairs"):
            env_tiles("MOE_CONFORMANCE_TEST_TILES")
    rows = subprocess.run([sys.executable, "-c", "from harness.backends.triton_bitplace import BITPLACE_TILES as t; "
                           "print(sorted({r[2]['group_m'] for r in t[1:3]}), t[1][2].get('tail_warps'))"],
                          capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[1],
                          env=dict(os.environ, MOE_CONFORMANCE_NVFP4_PREFILL_TILES="group_m=4,tail_warps=4"))
    assert rows.stdout.split() == ["[4]", "4"], rows.stdout + rows.stderr[-2000:]
    for bad in ("tail_wrps=4", "=4"):  # a key that is no launch parameter would change nothing, silently
        monkeypatch.setenv("MOE_CONFORMANCE_TEST_TILES", bad)
        with pytest.raises(ValueError, match="MOE_CONFORMANCE_TEST_TILES: unknown launch parameters"):
            env_tiles("MOE_CONFORMANCE_TEST_TILES")
