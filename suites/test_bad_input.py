"""Bad input gets a clear error naming the argument and what was expected; inputs are never mutated."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch

from reference import formats as F
from reference.checkpoints import make_checkpoint
from reference.fp8 import Granularity, ScaleApply, dequantize_fp8, quantize_fp8
from reference.moe import fused_moe
from reference.mx import dequantize_mx, qdq_mx, quantize_mx
from reference.nvfp4 import dequantize_nvfp4, nvfp4_global_encode_scale, quantize_nvfp4
from reference.packing import pack_fp4, unpack_fp4

X = torch.randn(4, 64)
MXQ = quantize_mx(X, F.E2M1)
NVQ = quantize_nvfp4(X)
FP8Q = quantize_fp8(X, F.E4M3FN, granularity=Granularity.PER_TOKEN)
CKPT = make_checkpoint("w_mxfp4", "SILU", 4, 128, 128, seed=0, with_bias=True)
MOE_X = torch.randn(8, 128).to(torch.bfloat16)
MOE_ROUTE = (torch.full((8, 3), 1 / 3), torch.tensor([[0, 1, 2]] * 8))

BAD_CALLS = {
    "mx_not_divisible": (lambda: quantize_mx(torch.randn(4, 48), F.E2M1), ValueError, r"x.shape\[-1\] = 48 .*block_size 32"),
    "mx_integer_dtype": (lambda: quantize_mx(torch.ones(4, 32, dtype=torch.int32), F.E2M1), TypeError, "x must be float32"),
    "mx_complex_dtype": (lambda: quantize_mx(torch.ones(4, 32, dtype=torch.complex64), F.E2M1), TypeError, "x must be float32"),
    "mx_not_a_tensor": (lambda: quantize_mx([1.0] * 32, F.E2M1), TypeError, "x must be a torch.Tensor"),
    "mx_scalar": (lambda: quantize_mx(torch.tensor(1.0), F.E2M1), ValueError, "at least one dimension"),
    "mx_bad_axis": (lambda: quantize_mx(X, F.E2M1, axis=2), ValueError, "axis=2 is out of range"),
    "mx_fnuz_element": (lambda: quantize_mx(X, F.E4M3FNUZ), ValueError, "elem must be an MX element format"),
    "mx_bad_block_size": (lambda: qdq_mx(X, F.E2M1, block_size=0), ValueError, "block_size must be a positive int"),
    "mx_bad_scale_mode": (lambda: quantize_mx(X, F.E2M1, scale_mode="floor"), ValueError, "scale_mode must be a ScaleMode"),
    "mx_scales_wrong_shape": (lambda: dequantize_mx(MXQ.codes, MXQ.scales[:, :1], F.E2M1), ValueError, r"scales must have shape \(4, 2\)"),
    "mx_scales_wrong_dtype": (lambda: dequantize_mx(MXQ.codes, MXQ.scales.int(), F.E2M1), TypeError, "scales must be uint8"),
    "mx_codes_out_of_range": (lambda: dequantize_mx(MXQ.codes | 0x10, MXQ.scales, F.E2M1), ValueError, "codes holds 0x1.*out of range for e2m1"),
    "mx_codes_wrong_dtype": (lambda: dequantize_mx(MXQ.codes.int(), MXQ.scales, F.E2M1), TypeError, "codes must be uint8"),
    "encode_nan_into_fp4": (lambda: F.encode(torch.tensor([float("nan")]), F.E2M1), ValueError, "NaN but e2m1 has no NaN"),
    "encode_nonfinite_policy_fp6": (lambda: F.encode(torch.tensor([1.0]), F.E3M2, F.Overflow.NONFINITE), ValueError, "NONFINITE needs a format"),
    "encode_e8m0_negative": (lambda: F.encode(torch.tensor([-1.0]), F.E8M0), ValueError, "must be positive"),
    "decode_codes_out_of_range": (lambda: F.decode(torch.tensor([0x40], dtype=torch.uint8), F.E2M3), ValueError, "out of range for e2m3"),
    "unknown_format": (lambda: F.format_by_name("e4m3"), ValueError, "unknown element format 'e4m3'"),
    "nvfp4_not_divisible": (lambda: quantize_nvfp4(torch.randn(2, 24)), ValueError, "divisible by the NVFP4 block 16"),
    "nvfp4_nan_input": (lambda: quantize_nvfp4(torch.full((1, 16), float("nan"))), ValueError, "x must be finite"),
    "nvfp4_both_global_scales": (lambda: quantize_nvfp4(X, global_encode_scale=torch.tensor(1.0), global_decode_scale=torch.tensor(1.0)), ValueError, "not both"),
    "nvfp4_zero_global_scale": (lambda: quantize_nvfp4(X, global_decode_scale=torch.tensor(0.0)), ValueError, "global_decode_scale must be positive"),
    "nvfp4_float64_global_scale": (lambda: quantize_nvfp4(X, global_encode_scale=torch.tensor(1.0, dtype=torch.float64)), TypeError, "global_encode_scale must be float32"),
    "nvfp4_global_scale_shape": (lambda: quantize_nvfp4(X, global_encode_scale=torch.ones(3)), ValueError, "does not broadcast"),
    "nvfp4_amax_too_small": (lambda: nvfp4_global_encode_scale(1e-37), ValueError, "too small for NVFP4"),
    "mx_dequantize_to_int8": (lambda: dequantize_mx(MXQ.codes, MXQ.scales, F.E2M1, dtype=torch.int8), TypeError, "dtype must be one of"),
    "nvfp4_dequantize_to_bool": (lambda: dequantize_nvfp4(NVQ.codes, NVQ.block_scales, NVQ.global_decode_scale, dtype=torch.bool), TypeError, "dtype must be one of"),
    "fp8_dequantize_to_fp8": (lambda: dequantize_fp8(FP8Q.codes, FP8Q.scale, F.E4M3FN, dtype=torch.float8_e4m3fn), TypeError, "dtype must be one of"),
    "nvfp4_block_scales_shape": (lambda: dequantize_nvfp4(NVQ.codes, NVQ.block_scales[:, :1], NVQ.global_decode_scale), ValueError, r"block_scales must have shape \(4, 4\)"),
    "fp8_not_divisible": (lambda: quantize_fp8(X, F.E4M3FN, granularity=Granularity.PER_BLOCK, block_shape=(1, 48)), ValueError, "not divisible by block_shape"),
    "fp8_block_shape_missing": (lambda: quantize_fp8(X, F.E4M3FN, granularity=Granularity.PER_BLOCK), ValueError, "PER_BLOCK needs block_shape"),
    "fp8_1d_input": (lambda: quantize_fp8(torch.randn(8), F.E4M3FN), ValueError, "at least 2 dims"),
    "fp8_e2m1_format": (lambda: quantize_fp8(X, F.E2M1), ValueError, "fmt must be one of"),
    "fp8_static_scale_shape": (lambda: quantize_fp8(X, F.E4M3FN, granularity=Granularity.PER_TOKEN, scale=torch.ones(3, 1)), ValueError, r"scale must have shape \(4, 1\)"),
    "fp8_static_scale_dtype": (lambda: quantize_fp8(X, F.E4M3FN, scale=torch.tensor(1, dtype=torch.int32)), TypeError, "scale must be a float32 tensor"),
    "fp8_negative_scale": (lambda: quantize_fp8(X, F.E4M3FN, scale=torch.tensor(-1.0)), ValueError, "scale must be positive"),
    "fp8_inf_input": (lambda: quantize_fp8(torch.full((2, 2), float("inf")), F.E4M3FN), ValueError, "x must be finite"),
    "fp8_max_value_above_format": (lambda: quantize_fp8(X, F.E4M3FNUZ, max_value=448.0), ValueError, r"max_value must be in \(0, 240"),
    "fp8_scale_does_not_tile": (lambda: dequantize_fp8(FP8Q.codes, torch.ones(3, 1), F.E4M3FN), ValueError, "does not tile"),
    "pack_odd_length": (lambda: pack_fp4(torch.zeros(3, dtype=torch.uint8)), ValueError, "must be even"),
    "pack_codes_too_big": (lambda: pack_fp4(torch.full((2,), 16, dtype=torch.uint8)), ValueError, "must be < 0x10"),
    "unpack_wrong_dtype": (lambda: unpack_fp4(torch.zeros(2, dtype=torch.int8)), TypeError, "packed must be a uint8"),
    # silent wrong answers before (issue 13): now rejected with the range or rule in the message
    "nvfp4_decode_scale_underflows": (lambda: quantize_nvfp4(X, global_decode_scale=torch.tensor(1e-45)), ValueError,
                                      r"global_decode_scale must lie in \[2\^-126, 2\^126\]"),
    "nvfp4_encode_scale_overflows": (lambda: quantize_nvfp4(X, global_encode_scale=torch.tensor(3e38)), ValueError,
                                     r"global_encode_scale must lie in \[2\^-126, 2\^126\]"),
    "fp8_subnormal_scale_reciprocal": (lambda: quantize_fp8(X, F.E4M3FN, scale=torch.tensor(1e-40),
                                                            scale_apply=ScaleApply.RECIPROCAL_MULTIPLY), ValueError,
                                       r"scale must be a normal fp32 \(>= 2\^-126\) with ScaleApply.RECIPROCAL_MULTIPLY"),
    "mx_shared_exponent_nan": (lambda: qdq_mx(X, F.E2M1, shared_exponent=torch.full((4, 2), float("nan"))), TypeError,
                               "shared_exponent must be an integer tensor"),
    "mx_shared_exponent_fraction": (lambda: qdq_mx(X, F.E2M1, shared_exponent=torch.full((4, 2), 0.5)), TypeError,
                                    "shared_exponent must be an integer tensor"),
    "mx_shared_exponent_range": (lambda: qdq_mx(X, F.E2M1, shared_exponent=torch.full((4, 2), 200)), ValueError,
                                 r"shared_exponent must lie in \[-127, 127\]"),
    "moe_duplicate_expert": (lambda: fused_moe(MOE_X, CKPT, torch.ones(8, 3), torch.tensor([[0, 1, 1]] * 8)), ValueError,
                             r"distinct experts within each token's top-k.*token 0 has \[0, 1, 1\]"),
    # crashes deep inside before: now the argument and what was expected
    "mx_float_axis": (lambda: quantize_mx(X, F.E2M1, axis=1.0), TypeError, r"axis must be an int, got 1.0 \(float\)"),
    "fp8_float_block_shape": (lambda: quantize_fp8(X, F.E4M3FN, granularity=Granularity.PER_BLOCK, block_shape=(1.0, 32.0)),
                              TypeError, r"block_shape\[0\] must be an int, got 1.0"),
    "checkpoint_float_experts": (lambda: make_checkpoint("w_mxfp4", "SILU", 2.5, 128, 128), ValueError,
                                 "num_experts must be a positive int, got 2.5"),
    "checkpoint_float_hidden": (lambda: make_checkpoint("w_mxfp4", "SILU", 2, 128.0, 128), TypeError,
                                r"hidden_size must be an int, got 128.0"),
    "mx_bool_block_size": (lambda: qdq_mx(X, F.E2M1, block_size=True), ValueError, "block_size must be a positive int, got True"),
    "mx_meta_device": (lambda: quantize_mx(torch.empty(4, 64, device="meta"), F.E2M1), ValueError, "x is on the meta device"),
    "fp8_float_scale": (lambda: dequantize_fp8(FP8Q.codes, 0.5, F.E4M3FN), TypeError, "scale must be a float32 tensor .*got float 0.5"),
    "nvfp4_global_scale_shape": (lambda: dequantize_nvfp4(NVQ.codes, NVQ.block_scales, torch.ones(3)), ValueError,
                                 r"global_decode_scale of shape \(3,\) does not broadcast"),
    "moe_hidden_size_mismatch": (lambda: fused_moe(MOE_X, dataclasses.replace(CKPT, hidden_size=256), *MOE_ROUTE), ValueError,
                                 r"ckpt.w13.data must be \[4, 256, 128\] uint8 .*got \[4, 256, 64\]"),
    "moe_w13_w2_swapped": (lambda: fused_moe(MOE_X, dataclasses.replace(CKPT, w13=CKPT.w2, w2=CKPT.w13), *MOE_ROUTE), ValueError,
                           r"ckpt.w13.data must be \[4, 256, 64\] uint8 \(\[E, N13, H\].*got \[4, 128, 64\]"),
    "moe_ckpt_none": (lambda: fused_moe(MOE_X, None, *MOE_ROUTE), TypeError, "ckpt must be a reference.checkpoints.MoECheckpoint, got NoneType"),
    "moe_w2_scale_wrong": (lambda: fused_moe(MOE_X, dataclasses.replace(CKPT, w2=dataclasses.replace(CKPT.w2, scale=CKPT.w2.scale[:, :, :2])),
                                             *MOE_ROUTE), ValueError, r"ckpt.w2.scale must be \[4, 128, 4\] uint8 .*got \[4, 128, 2\]"),
    "moe_bias_wrong_shape": (lambda: fused_moe(MOE_X, dataclasses.replace(CKPT, b2=torch.zeros(4, 7)), *MOE_ROUTE), ValueError,
                             r"ckpt.b2 must be \[4, 128\] float32"),
}


@pytest.mark.parametrize("name", sorted(BAD_CALLS))
def test_bad_input_is_rejected_with_a_clear_error(name):
    call, exc, pattern = BAD_CALLS[name]
    with pytest.raises(exc, match=pattern):
        call()


def test_inputs_are_never_mutated():
    x = torch.randn(8, 64) * 100
    x[0, :32] = float("nan")  # a NaN block goes through a masked path
    x_t = x.T  # non-contiguous
    before = x.clone()
    for elem in (F.E2M1, F.E4M3FN):
        quantize_mx(x, elem)
        qdq_mx(x, elem)
        quantize_mx(x_t, elem, axis=0)
    finite = torch.nan_to_num(x)
    before_finite = finite.clone()
    quantize_nvfp4(finite)
    quantize_fp8(finite, F.E4M3FN, granularity=Granularity.PER_BLOCK, block_shape=(8, 32))
    F.encode(finite, F.E4M3FN)
    assert torch.equal(finite, before_finite)
    assert torch.equal(torch.nan_to_num(x, nan=7.0), torch.nan_to_num(before, nan=7.0))


def test_non_contiguous_input_gives_the_same_result():
    x = torch.randn(64, 96)
    xt = x.T  # [96, 64], non-contiguous
    assert torch.equal(quantize_mx(xt, F.E2M1).codes, quantize_mx(xt.contiguous(), F.E2M1).codes)
    assert torch.equal(quantize_nvfp4(xt).codes, quantize_nvfp4(xt.contiguous()).codes)


def test_same_input_gives_bit_identical_output_run_to_run():
    x = torch.randn(32, 256)
    a, b = qdq_mx(x, F.E3M2), qdq_mx(x.clone(), F.E3M2)
    assert torch.equal(a.view(torch.int32), b.view(torch.int32))


@pytest.mark.parametrize("args, words", [
    (["oracle", "--platform", "nonexistent"], "argument --platform: invalid choice: 'nonexistent' (choose from 'cpu', 'sm90'"),
    (["oracle", "--scheme", "w_mxfp5"], "argument --scheme: invalid choice: 'w_mxfp5'"),
    (["bench-reference", "--repeat", "0"], "argument --repeat: expected a positive int, got 0"),
    (["bench-reference", "--rows", "-4"], "argument --rows: expected a positive int, got -4"),
    (["bench-reference", "--cols", "33"], "argument --cols: expected a positive multiple of 32, got 33"),
    (["bench-reference", "--cols", "many"], "argument --cols: expected an int, got 'many'"),
    (["parallel", "--tp", "2", "--ep", "2"], "TP and EP together (tp=2, ep=2) is not modelled"),
    (["parallel", "--world", "mpi"], "argument --world: invalid choice: 'mpi'"),
])
def test_the_cli_answers_bad_arguments_like_argparse(args, words, capsys):
    """In process (a subprocess each cost ~2.5 s of CI's 2 cores): exit status 2 and argparse's line; any other
    exception (a traceback) fails the test. The entry point itself: the next test."""
    from harness.__main__ import main

    try:
        code = main(args)  # a value the command checks itself: its message, status 2
    except SystemExit as stopped:  # argparse's own checks
        code = stopped.code
    err = capsys.readouterr().err
    assert code == 2 and words in err, err


def test_python_m_harness_exits_2_with_one_line_on_a_bad_argument():
    proc = subprocess.run([sys.executable, "-m", "harness", "bench-reference", "--cols", "33"], capture_output=True,
                          text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "argument --cols: expected a positive multiple of 32, got 33" in proc.stderr, proc.stderr


def test_python_m_harness_backends_lists_every_backend_with_what_it_declares():
    proc = subprocess.run([sys.executable, "-m", "harness", "backends", "--backend", "examples.simple_backend:make_backend"],
                          capture_output=True, text=True, check=True)
    out = proc.stdout
    for name in ("triton_emulation", "torch_emulation", "torch_fp8", "aiter", "simple_example"):
        assert f"\n{name}" in "\n" + out
    assert "aiter  (capability model: does not run)" in out
    assert "structure rounded_terms" in out and "cpu     supports 192 of 192 scheme x activation; runs here" in out
    assert "torch_fp8" in out and ("not here: needs a GPU" in out or "runs here" in out)
