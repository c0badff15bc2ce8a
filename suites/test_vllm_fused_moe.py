"""vLLM's released fused MoE under test (harness.backends.vllm_fused_moe), and the pinned-source machinery
behind it (harness.third_party). The conformance and special-value suites run both releases like every
backend; this file checks what only they have: the adapter's facts against the fetched source, the release
pair (the FP8 bias bug in 0.13.0 and nothing else; 0.33.0 clean), the routing glue, and the loader."""

from __future__ import annotations

import ast
import re

import pytest
import torch

from harness import third_party
from harness.backends import backend_structure, load_backend
from harness.backends.vllm_fused_moe import RELEASES, VllmFusedMoE
from harness.core.conformance import SHAPES, compare_backend, reference_run
from harness.platforms import PLATFORMS, detect_platform
from reference.activations import ACTIVATIONS

HOST = detect_platform()
pytestmark = [getattr(pytest.mark, p) for p in PLATFORMS]  # facts about the adapter hold on every platform


def _source(version: str):
    folder = third_party.source_dir(RELEASES[version].source)
    if folder is None:
        pytest.skip(third_party.missing_reason(RELEASES[version].source))
    return folder


def _source_activations(version: str) -> set[str]:
    """The activations the release's fused_experts_impl dispatches, read from its own files."""
    folder = _source(version)
    activation_py = folder / "vllm/model_executor/layers/fused_moe/activation.py"
    if activation_py.is_file():  # 0.33: apply_moe_activation's _APPLY_MOE_ACTIVATIONS
        tree = ast.parse(activation_py.read_text())
        node = next(n for n in tree.body if isinstance(n, ast.Assign)
                    and any(getattr(t, "id", "") == "_APPLY_MOE_ACTIVATIONS" for t in n.targets))
        return {a.attr for a in ast.walk(node.value) if isinstance(a, ast.Attribute) and a.attr.isupper()}
    text = (folder / "vllm/model_executor/layers/fused_moe/fused_moe.py").read_text()
    body = text[text.index("def fused_experts_impl("):]
    body = body[: body.index("\ndef ", 1)]
    return ({m.upper() for m in re.findall(r'activation == "(\w+)"', body)}
            | set(re.findall(r"activation == (\w+_NO_MUL)\b", body)))


@pytest.mark.parametrize("version", sorted(RELEASES))
def test_each_release_supports_the_activations_its_source_dispatches(version):
    in_source = _source_activations(version)
    ours = in_source & set(ACTIVATIONS)  # SWIGLUOAI_UNINTERLEAVE (packed gpt-oss layout) has no record here
    assert in_source - ours <= {"SWIGLUOAI_UNINTERLEAVE"}, in_source - ours
    assert RELEASES[version].activations == ours, (RELEASES[version].activations ^ ours)


def _run(version, scheme, act, bias):
    backend = load_backend(f"vllm_fused_moe@{version}")
    ok, why = backend.available(HOST)
    if not ok:
        pytest.skip(why)
    shape = SHAPES["gpu" if HOST.is_gpu else "cpu"]
    ckpt, inputs, out, trace = reference_run(scheme, act, HOST.fp8_format.name, shape, 0, backend_structure(backend),
                                             bias)
    return compare_backend(backend, ckpt, inputs, out, trace, f"{scheme}/{act}/{backend.name}/bias={bias}")


@pytest.mark.parametrize("act", sorted(RELEASES["0.13.0"].activations & RELEASES["0.33.0"].activations))
def test_the_release_pair_differs_only_in_the_biased_per_tensor_fp8_cases(act):
    """0.13.0 adds the bias before the per-tensor FP8 scales (fixed by vLLM PR 31676 in 0.14.0): its biased
    w_fp8_a_fp8 case fails, the same case without biases passes; 0.33.0 passes both; the block-FP8 path
    (scales applied inside the K loop, the bias after) passes in both."""
    assert not _run("0.13.0", "w_fp8_a_fp8", act, True).ok
    for version, scheme, bias in (("0.13.0", "w_fp8_a_fp8", False), ("0.33.0", "w_fp8_a_fp8", True),
                                  ("0.33.0", "w_fp8_a_fp8", False), ("0.13.0", "w_fp8_a_fp8_block", True)):
        result = _run(version, scheme, act, bias)
        assert result.ok, result.message()


def test_at_the_gpu_shape_with_the_gpu_declarations_the_bias_bug_still_fails():
    """On the H200 the per-tensor FP8 cases run on Hopper's FP8 matrix units, so the adapter declares the platform's
    FP8 accumulation error there (harness.platforms); before issue 24 it also declared bf16 operands for every
    scheme, which hid 0.13.0's bias bug on 5 of its 6 biased cases at the GPU shape (results/gpu-issue23/run-7).
    With the declarations a compiled sm90 run makes, at the GPU shape: 0.13.0 fails on a large share of the
    elements (39-54% over the activations on the H200 under the 2^-11 declaration, results/gpu-issue25/run-5; 22% of
    this SILU case under today's 2^-10, measured here, at up to 4.95x the bound), 0.33.0 passes."""
    from harness.core.tolerances import compare, moe_error_bound
    from harness.backends import backend_operand_dtype

    sm90 = PLATFORMS["sm90"].fp8_mma_accumulation_error
    for version, fails in (("0.13.0", True), ("0.33.0", False)):
        backend = load_backend(f"vllm_fused_moe@{version}")
        ok, why = backend.available(HOST)
        if not ok:
            pytest.skip(why)
        assert backend_operand_dtype(backend, "w_fp8_a_fp8") == torch.float32
        ckpt, inputs, out, trace = reference_run("w_fp8_a_fp8", "SILU", "e4m3fn", SHAPES["gpu"], 0,
                                                 backend_structure(backend), True)
        got = backend.forward(backend.prepare(ckpt), *(t.to(backend.device) for t in inputs)).cpu()
        result = compare(out, got, moe_error_bound(trace, ckpt, torch.float32, sm90), f"{version} at the GPU shape")
        assert (result.n_bad > 0.15 * result.n_total) if fails else result.ok, result.message()


def test_routing_glue_follows_moe_align_block_size():
    """Pairs grouped by expert in index order, each expert's run padded to BLOCK_SIZE_M with the sentinel
    T*k, one expert id per block, num_tokens_post_padded the padded total; 0.33's naive path (one pair per
    block) when T*k*4 <= E."""
    backend = VllmFusedMoE("0.33.0")
    ids = torch.tensor([[2, 3, 0], [1, 2, 0], [1, 3, 0], [1, 2, 3]], dtype=torch.int32)
    if third_party.source_dir(backend.release.source) is None:
        pytest.skip(third_party.missing_reason(backend.release.source))
    sorted_ids, expert_ids, padded = backend._assign(ids, 4, 5, 4, 3)
    assert int(padded) == 16
    assert sorted_ids[:16].tolist() == [2, 5, 8, 12, 3, 6, 9, 12, 0, 4, 10, 12, 1, 7, 11, 12]
    assert expert_ids[:4].tolist() == [0, 1, 2, 3]
    assert bool((sorted_ids[16:] == 12).all())
    naive_ids, experts, total = backend._assign(torch.tensor([[3]], dtype=torch.int32), 16, 8, 1, 1)
    assert naive_ids is None and experts.tolist() == [3] and int(total) == 16


def test_cutting_a_function_names_what_it_needs_that_is_not_there(tmp_path):
    src = tmp_path / "mod.py"
    src.write_text("import triton\n\n@triton.jit\ndef helper(x):\n    return x\n\n\n@triton.jit\n"
                   "def kernel(p):\n    y = helper(p)\n    return other(y)\n\n\ndef other(z):\n    return some_global(z)\n")
    cut = third_party._cut(src, ("helper",), {"triton", "tl"})
    assert [name for name, _ in cut] == ["helper"] and cut[0][1].startswith("@triton.jit")
    with pytest.raises(ValueError, match=r"kernel -> other uses 'some_global', which is neither a function"):
        third_party._cut(src, ("kernel",), {"triton", "tl"})


def test_a_missing_source_is_a_skip_that_says_how_to_fetch_it(tmp_path, monkeypatch):
    monkeypatch.setenv("MOE_CONFORMANCE_THIRD_PARTY", str(tmp_path))
    backend = VllmFusedMoE("0.33.0")
    ok, why = backend.available(PLATFORMS["cpu"])
    assert not ok and "vllm==0.33.0 is not in" in why and "make third-party" in why
    (tmp_path / "vllm-0.33.0.fetch-failed").write_text("pip download ...\nERROR: No matching distribution\n")
    assert "the last fetch failed: ERROR: No matching distribution" in third_party.missing_reason("vllm-0.33.0")


def test_triton_kernels_ogs_says_what_it_runs_and_where():
    """OpenAI's matmul_ogs: SWIGLUOAI only (vLLM asserts it), bf16 / w_mxfp4, power-of-two top_k; never on a CPU."""
    from harness.backends import Problem, load_backend
    from harness.platforms import detect_platform
    from reference.activations import activation_by_name
    from reference.schemes import scheme_by_name

    b = load_backend("triton_kernels_ogs")
    host = detect_platform()
    ok, _ = b.supports(Problem(scheme_by_name("w_mxfp4"), activation_by_name("SWIGLUOAI"), top_k=4), host)
    assert ok
    ok, why = b.supports(Problem(scheme_by_name("w_mxfp4"), activation_by_name("SILU"), top_k=4), host)
    assert not ok and "SWIGLUOAI" in why
    ok, why = b.supports(Problem(scheme_by_name("bf16"), activation_by_name("SWIGLUOAI"), top_k=3), host)
    assert not ok and "power-of-two" in why
    if not host.is_gpu:
        ok, why = b.available(host)
        assert not ok and ("GPU" in why or "make third-party" in why)


@pytest.mark.parametrize("scheme", ["w_mxfp4", "bf16"])
def test_triton_kernels_ogs_pads_the_intermediate_size_as_vllm_without_changing_the_moe(scheme):
    """vLLM rounds MXFP4's intermediate size up to 64 for matmul_ogs (which is wrong at K = 32 mod 64:
    tools/repro_ogs_k_tail.py); the zero pairs must leave the reference output identical, bit for bit."""
    from harness.backends.triton_kernels_ogs import pad_intermediate
    from harness.core.conformance import Shape
    from reference.moe import fused_moe

    ckpt, (x, w, ids), out, _ = reference_run(scheme, "SWIGLUOAI", "e4m3fn", Shape(4, 64, 96, 5, 2), 0,
                                              backend_structure(load_backend("triton_kernels_ogs")), True)
    padded = pad_intermediate(ckpt, 64)
    assert padded.intermediate_size == 128 and pad_intermediate(padded, 64) is padded
    assert padded.w13.data.shape[1] == 256 and not padded.w13.data[:, 192:].any() and not padded.b13[:, 192:].any()
    structure = backend_structure(load_backend("triton_kernels_ogs"))
    assert torch.equal(fused_moe(x, padded, w, ids, structure=structure), fused_moe(x, ckpt, w, ids, structure=structure))


def test_model_shapes_skip_a_share_the_block_does_not_divide(capsys):
    """gpt-oss-20b at TP 8 (I / tp = 360): NVFP4's 16-blocks do not divide it (skipped, saying so); MXFP4 runs as
    vLLM's padded last rank (harness.core.real_shapes.share_intermediate)."""
    from harness.__main__ import main

    assert main(["model-shapes", "--backend", "torch_emulation", "--model", "gpt-oss-20b", "--tp", "8",
                 "--tokens", "1", "--scheme", "w_nvfp4", "--scheme", "w_mxfp4"]) == 0
    out = capsys.readouterr().out
    assert "intermediate_size=360 must be a positive multiple of 16" in out
    assert "passed   gpt-oss-20b/tp8/T1 (last rank, vLLM's padding: I 384, 192 real)/w_mxfp4/torch_emulation" in out, out
