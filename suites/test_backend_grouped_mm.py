"""The grouped-GEMM backends (harness.backends.torch_grouped_mm, harness.backends.jax_ragged_dot) on the
CPU: the row grouping, the scale expansion and the glue around the GEMMs. JAX's ragged dot runs here as it
is (jax's CPU build). torch._grouped_mm runs here (torch's CPU fallback), so the bf16
backend is judged by the real op; torch._scaled_grouped_mm is CUDA-only, so the FP8 backend runs here with an
fp32 emulation of that op in its place (the GPU run is recorded in results/). Each piece of glue that can be
wrong is shown to fail the conformance check when it is."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.backends.jax_ragged_dot import JaxRaggedDotBackend
from harness.backends.torch_grouped_mm import TorchGroupedMMBackend, TorchScaledGroupedMMBackend, group_rows
from harness.core.conformance import SHAPES, ConformanceCase, moe_property_examples, run_case, run_drawn_case
from harness.platforms import PLATFORMS
from reference.activations import ACTIVATIONS
from reference.schemes import SCHEMES

SM90 = PLATFORMS["sm90"]


@given(tokens=st.integers(1, 12), top_k=st.integers(1, 4), experts=st.integers(4, 9),
       alignment=st.sampled_from([1, 4, 16]), data=st.data())
def test_group_rows_puts_every_pair_once_in_its_experts_aligned_group(tokens, top_k, experts, alignment, data):
    ids = torch.tensor(data.draw(st.lists(st.lists(st.integers(0, experts - 1), min_size=top_k, max_size=top_k,
                                                   unique=True), min_size=tokens, max_size=tokens)))
    g = group_rows(ids, experts, alignment)
    ends = g.offsets.long().tolist()
    starts = [0] + ends[:-1]
    assert g.rows == ids.numel() + experts * (alignment - 1) >= ends[-1]
    assert bool((g.source[ends[-1]:] == -1).all())  # spare rows after the last group
    assert all((e - s) % alignment == 0 and e >= s for s, e in zip(starts, ends))
    flat = ids.reshape(-1)
    assert sorted(g.source[g.real].tolist()) == list(range(flat.numel()))  # each pair once
    for e, (s, end) in enumerate(zip(starts, ends)):
        group = g.source[s:end]
        pairs = group[group >= 0]
        assert bool((flat[pairs] == e).all())
        assert pairs.tolist() == sorted(pairs.tolist())  # stable: (token, k) order within an expert
        assert end - s - pairs.numel() < alignment  # no more padding than the alignment needs
        assert bool((group[pairs.numel():] == -1).all())  # padding after the real rows


def _emulated_scaled_grouped_mm(a8, b, scale_a, scale_b, *, offs, out_dtype):
    """What torch._scaled_grouped_mm computes (2D x 3D, rowwise scales): per group, the exact product of the
    FP8 values accumulated (here in float64), times scale_a[row] * scale_b[expert, col] in fp32, rounded
    once to out_dtype. Rows past the last offset stay zero."""
    out = torch.zeros(a8.shape[0], b.shape[-1], dtype=torch.float32)
    start = 0
    for e, end in enumerate(offs.tolist()):
        acc = (a8[start:end].double() @ b[e].double()).float()
        out[start:end] = acc * scale_a[start:end, None] * scale_b[e][None, :]
        start = end
    return out.to(out_dtype)


def _fp8_case(act="SILU"):
    return ConformanceCase("torch_scaled_grouped_mm", SM90, SCHEMES["w_fp8_a_fp8"], ACTIVATIONS[act])


@pytest.mark.parametrize("act", ["SILU", "GELU", "SWIGLUOAI"])
def test_torch_grouped_mm_bf16_passes_with_torchs_own_op(act):
    case = ConformanceCase("torch_grouped_mm", PLATFORMS["cpu"], SCHEMES["bf16"], ACTIVATIONS[act])
    result = run_case(TorchGroupedMMBackend(device="cpu"), case, SHAPES["cpu"])
    assert result.ok, result.message


@pytest.mark.parametrize("act", ["SILU", "GELU", "SWIGLUOAI"])
def test_torch_scaled_grouped_mm_glue_passes_with_an_emulated_op(act):
    backend = TorchScaledGroupedMMBackend(device="cpu", scaled_grouped_mm=_emulated_scaled_grouped_mm)
    result = run_case(backend, _fp8_case(act), SHAPES["cpu"])
    assert result.ok, result.message


@settings(max_examples=moe_property_examples())
@given(tokens=st.integers(1, 20), routing=st.sampled_from(["random", "all_to_one", "skip_experts"]),
       seed=st.integers(0, 3))
def test_grouped_backends_hold_for_any_tokens_and_routing(tokens, routing, seed):
    """Experts with no rows, all rows on one expert, group sizes that are and are not multiples of 16."""
    emulated = dict(device="cpu", scaled_grouped_mm=_emulated_scaled_grouped_mm)
    for backend, scheme in ((TorchGroupedMMBackend(device="cpu"), "bf16"),
                            (TorchScaledGroupedMMBackend(**emulated), "w_fp8_a_fp8"),
                            (TorchScaledGroupedMMBackend(**emulated, row_alignment=16), "w_fp8_a_fp8")):
        result = run_drawn_case(backend, scheme, "SILU", SM90, SHAPES["cpu"], seed, tokens, 3, routing)
        assert not isinstance(result, str), result
        assert result.ok, result.message


def test_padding_rows_never_reach_the_output():
    """Whatever the GEMM leaves in the padding rows (here NaN) is dropped before the top-k sum."""
    def poisoned(a8, b, scale_a, scale_b, *, offs, out_dtype):
        out = _emulated_scaled_grouped_mm(a8, b, scale_a, scale_b, offs=offs, out_dtype=out_dtype)
        return torch.where((a8.float() == 0).all(dim=1, keepdim=True), torch.nan, out.float()).to(out_dtype)

    backend = TorchScaledGroupedMMBackend(device="cpu", scaled_grouped_mm=poisoned, row_alignment=16)
    result = run_case(backend, _fp8_case(), SHAPES["cpu"])
    assert result.ok, result.message


def test_weight_scales_are_one_per_expert_expanded_over_its_columns():
    from harness.core.conformance import case_checkpoint

    ckpt = case_checkpoint("w_fp8_a_fp8", "SILU", "e4m3fn", SHAPES["cpu"], 0, False)
    prep = TorchScaledGroupedMMBackend(device="cpu", scaled_grouped_mm=_emulated_scaled_grouped_mm).prepare(ckpt)
    for name in ("w13", "w2"):
        w = getattr(ckpt, name)
        e, n, k = w.data.shape
        assert tuple(prep[name].shape) == (e, k, n) and prep[name].stride(-2) == 1  # column-major [E, K, N]
        assert torch.equal(prep[f"{name}_scale"], w.scale.reshape(e, 1).expand(e, n))


# ---- the checks catch wrong glue --------------------------------------------------------------------


class _ScaleOfExpertZero(TorchScaledGroupedMMBackend):
    def prepare(self, ckpt):
        prep = super().prepare(ckpt)
        for name in ("w13", "w2"):
            prep[f"{name}_scale"] = prep[f"{name}_scale"][:1].expand_as(prep[f"{name}_scale"]).contiguous()
        return prep


class _OffsetsOffByOne(TorchScaledGroupedMMBackend):
    """GEMM1's offs off by one expert (expert e's group ends where e + 1's does): rows meet the wrong weights."""

    def _gemm(self, prep, name, a, groups):
        shifted = dataclasses.replace(groups, offsets=torch.cat([groups.offsets[1:], groups.offsets[-1:]]))
        return super()._gemm(prep, name, a, shifted if name == "w13" else groups)


class _GateUpSwapped(TorchGroupedMMBackend):
    """w13's rows read as [up; gate] instead of [gate; up]."""

    @staticmethod
    def _gemm(prep, name, a, groups):
        out = TorchGroupedMMBackend._gemm(prep, name, a, groups)
        return torch.cat(out.chunk(2, dim=1)[::-1], dim=1) if name == "w13" else out


@pytest.mark.parametrize("wrong", [_ScaleOfExpertZero, _OffsetsOffByOne], ids=lambda c: c.__name__.strip("_"))
def test_wrong_fp8_glue_fails_conformance(wrong):
    result = run_case(wrong(device="cpu", scaled_grouped_mm=_emulated_scaled_grouped_mm), _fp8_case(), SHAPES["cpu"])
    assert not result.ok


def test_gate_and_up_swapped_fails_bf16_conformance():
    case = ConformanceCase("torch_grouped_mm", PLATFORMS["cpu"], SCHEMES["bf16"], ACTIVATIONS["SILU"])
    assert not run_case(_GateUpSwapped(device="cpu"), case, SHAPES["cpu"]).ok


# ---- JAX's ragged dot ----------------------------------------------------------------------------------

_JAX_OK, _JAX_WHY = JaxRaggedDotBackend(device="cpu").available(PLATFORMS["cpu"])
needs_jax = pytest.mark.skipif(not _JAX_OK, reason=_JAX_WHY)


@needs_jax
@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("act", ["SILU", "GELU", "SWIGLUOAI"])
def test_jax_ragged_dot_bf16_passes(act, out_dtype):
    """Both output dtypes conform on the CPU (XLA:CPU rounds its fp32 accumulator once either way)."""
    case = ConformanceCase("jax_ragged_dot", PLATFORMS["cpu"], SCHEMES["bf16"], ACTIVATIONS[act])
    result = run_case(JaxRaggedDotBackend(device="cpu", out_dtype=out_dtype), case, SHAPES["cpu"])
    assert result.ok, result.message


@needs_jax
@settings(max_examples=moe_property_examples())
@given(tokens=st.integers(0, 20), routing=st.sampled_from(["random", "all_to_one", "skip_experts"]))
def test_jax_ragged_dot_holds_for_any_tokens_and_routing(tokens, routing):
    result = run_drawn_case(JaxRaggedDotBackend(device="cpu"), "bf16", "SILU", PLATFORMS["cpu"], SHAPES["cpu"], 0,
                            tokens, 3, routing)
    assert not isinstance(result, str), result
    assert result.ok, result.message


class _CumulativeGroupSizes(JaxRaggedDotBackend):
    """The grouped GEMMs' `offs` (ends) passed where ragged_dot wants group sizes."""

    def _gemm(self, prep, name, a, groups):
        import jax

        from harness.backends import jax_ragged_dot

        out = jax_ragged_dot._ragged_dot(jax.dlpack.from_dlpack(a.to(torch.bfloat16).contiguous()), prep[name],
                                         jax.dlpack.from_dlpack(groups.offsets.contiguous()), "float32")
        return torch.from_dlpack(out).to(torch.bfloat16)


@needs_jax
def test_ragged_dot_given_offsets_for_sizes_fails():
    case = ConformanceCase("jax_ragged_dot", PLATFORMS["cpu"], SCHEMES["bf16"], ACTIVATIONS["SILU"])
    assert not run_case(_CumulativeGroupSizes(device="cpu"), case, SHAPES["cpu"]).ok
