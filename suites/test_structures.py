"""Numerical structures (reference.structure): each is a declaration the suite checks, not trusts.
An independent emulation of every structure passes its own cases, and changing any one field of any
structure (where the change can show) is caught, so a kernel that declares one structure and computes
another fails. Where two structures are the same computation the test says why and skips that pair."""

from __future__ import annotations

import dataclasses
import enum

import pytest
import torch

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.backends import backend_structure, registered_backends
from harness.detection.catalog import CONTROL, make_mutant
from harness.core.conformance import ROUTINGS, SHAPES, case_inputs, run_drawn_case
from harness.platforms import PLATFORMS
from harness.backends.emulation import moe_emulation
from harness.inputs.special_values import SPECIAL_CASES
from harness.core.tolerances import compare, moe_error_bound
from reference.activations import ACTIVATIONS
from reference.checkpoints import make_checkpoint
from reference.fp8 import ScaleApply
from reference.moe import fused_moe
from reference.schemes import SCHEMES
from reference.structure import (DEFAULT_STRUCTURE, STRUCTURES, ActivationEval, ActivationRule, NumericalStructure,
                                 Precision, RouterWeight, TopKSum, structure_by_name)

FIELDS = ("gemm1_out", "act_out", "gemm2_out", "router_weight", "activation", "topk_sum", "fp8_static_scale")
CASES = (("w_mxfp4", "SILU"), ("w_fp8_a_fp8_block", "RELU2_NO_MUL"), ("bf16", "SWIGLUOAI"), ("w_nvfp4_a_nvfp4", "GELU"))
TIES = next(c for c in SPECIAL_CASES if c.name == "fp8_static_scale_ties")


def _shape(structure: NumericalStructure):
    shape = SHAPES["cpu"]
    return shape if structure.max_top_k is None else dataclasses.replace(shape, top_k=structure.max_top_k)


def _run(structure, scheme, act, seed=0, ties=False):
    shape = _shape(structure)
    ckpt = make_checkpoint(scheme, act, shape.num_experts, shape.hidden_size, shape.intermediate_size, seed=seed,
                           with_bias=True)
    x, w, ids = case_inputs(shape, seed)
    if ties:
        ckpt, (x, w, ids) = TIES.checkpoint(ckpt), TIES.inputs(x, w, ids)
    out, trace = fused_moe(x, ckpt, w, ids, structure=structure, trace=True)
    return ckpt, (x, w, ids), out, trace


@pytest.mark.parametrize("name", list(STRUCTURES))
def test_an_independent_emulation_of_each_structure_passes(name):
    structure = STRUCTURES[name]
    for scheme, act in CASES + (("w_mxfp4_a_mxfp4", "SITU"), ("w_fp8_a_fp8", "GELU_TANH_NO_MUL")):
        ckpt, (x, w, ids), out, trace = _run(structure, scheme, act)
        for operand_dtype in (torch.float32, torch.bfloat16):
            for order in (None, 7):
                got = moe_emulation(x, ckpt, w, ids, structure=structure, operand_dtype=operand_dtype,
                                    k_permutation_seed=order)
                c = compare(out, got, moe_error_bound(trace, ckpt, operand_dtype), f"{scheme}/{act}/{name}",
                            structure=structure)
                assert c.ok, c.message()


@settings(max_examples=40, suppress_health_check=[HealthCheck.filter_too_much])
@given(
    name=st.sampled_from(list(STRUCTURES)),
    scheme=st.sampled_from(sorted(SCHEMES)),
    act=st.sampled_from(sorted(ACTIVATIONS)),
    platform=st.sampled_from(["cpu", "gfx942"]),
    seed=st.integers(0, 2**16),
    tokens=st.integers(0, 10),
    top_k=st.integers(1, 4),
    routing=st.sampled_from(ROUTINGS),
)
def test_an_independent_emulation_of_each_structure_passes_the_hypothesis_run(name, scheme, act, platform, seed,
                                                                             tokens, top_k, routing):
    """The conformance suite's own Hypothesis case (harness.core.conformance.run_drawn_case) on the catalog's
    correct base declaring and computing each structure."""
    control = make_mutant(CONTROL.name, name)
    result = run_drawn_case(control, scheme, act, PLATFORMS[platform], SHAPES["cpu"], seed, tokens, top_k, routing)
    assert not isinstance(result, str), result
    assert result.ok, result.message()


def _equivalent(structure: NumericalStructure, other: NumericalStructure, top_k: int) -> str | None:
    """Why two structures compute the same values here (then no comparison can tell them apart)."""
    fp32_terms = structure.gemm2_out is Precision.FP32 and other.gemm2_out is Precision.FP32
    if structure.topk_sum is not other.topk_sum and structure.topk_sum.for_top_k(top_k) is other.topk_sum.for_top_k(top_k):
        return f"the same sum at top_k = {top_k} (vLLM's moe_sum is sequential for top_k 2-4)"
    if structure.topk_sum is not other.topk_sum and (top_k == 1 or fp32_terms):
        return "one term: nothing to sum" if top_k == 1 else "a sequential fp32 sum is one order of an fp32 sum"
    unweighted = RouterWeight.AFTER_GEMM2_ROUNDING not in (structure.router_weight, other.router_weight)
    if (top_k == 1 and unweighted and structure.gemm2_out is not other.gemm2_out
            and {structure.gemm2_out, other.gemm2_out} == {Precision.BF16, Precision.FP32}):
        return "one term, rounded to bf16 at the output either way"
    weights = {structure.router_weight, other.router_weight}
    if fp32_terms and weights == {RouterWeight.AFTER_GEMM2_ROUNDING, RouterWeight.GEMM2_EPILOGUE}:
        return "fp32 GEMM2 outputs: w * fl(z) and fl(w * z) differ by an fp32 rounding, inside any bound"
    return None


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("name", list(STRUCTURES))
def test_changing_any_field_of_a_structure_is_caught(name, field):
    structure = STRUCTURES[name]
    top_k = _shape(structure).top_k
    current = getattr(structure, field)
    checked = 0
    for alternative in type(current):
        if alternative is current:
            continue
        # changing the activation field is the old one-flag-for-all: the default, with no per-activation rules
        rules = dict(activation_rules=()) if field == "activation" else {}
        other = dataclasses.replace(structure, name=f"{name}[{field}={alternative.name}]", **{field: alternative},
                                    **rules)
        if (other.max_top_k or top_k) < top_k or _equivalent(structure, other, top_k):
            continue
        cases = [("w_fp8_a_fp8", "SILU")] if field == "fp8_static_scale" else CASES
        caught = []
        for scheme, act in cases:
            ckpt, (x, w, ids), out, trace = _run(structure, scheme, act, ties=field == "fp8_static_scale")
            got = moe_emulation(x, ckpt, w, ids, structure=other, operand_dtype=torch.float32)
            caught.append(not compare(out, got, moe_error_bound(trace, ckpt), other.name).ok)
        assert any(caught), f"{other.name}: a kernel computing it passes as {name} on {cases}"
        checked += 1
    assert checked or field in ("topk_sum", "router_weight"), f"no alternative of {field} was checked"


@pytest.mark.parametrize("name", [n for n, s in STRUCTURES.items() if s.activation_rules])
def test_flipping_any_gated_activation_rule_is_caught(name):
    """Each per-activation rule matters: a kernel that rounds the gate where the rule says once (or the
    reverse) fails that activation's case."""
    structure = STRUCTURES[name]
    for rule in structure.activation_rules:
        if not ACTIVATIONS[rule.activation].gated:
            continue
        flipped = next(e for e in type(rule.evaluation) if e is not rule.evaluation)
        other = dataclasses.replace(structure, name=f"{name}[{rule.activation}={flipped.name}]", activation_rules=tuple(
            dataclasses.replace(r, evaluation=flipped) if r is rule else r for r in structure.activation_rules))
        assert other.activation_eval(ACTIVATIONS[rule.activation]) is flipped
        caught = []
        for seed in range(3):
            ckpt, (x, w, ids), out, trace = _run(structure, "bf16", rule.activation, seed=seed)
            got = moe_emulation(x, ckpt, w, ids, structure=other, operand_dtype=torch.float32)
            caught.append(not compare(out, got, moe_error_bound(trace, ckpt), other.name).ok)
        assert any(caught), f"{other.name}: a kernel computing it passes as {name}"


def test_vllm_moe_sum_is_sequential_up_to_top_k_4_and_fp32_above():
    """vLLM's moe_sum: moe_sum_kernel<TOPK> (a bf16 running sum) for top_k 2-4, at::sum_out (fp32) otherwise.
    At top_k 8 the sequential bf16 sum is caught against it, and an fp32 sum passes."""
    assert [TopKSum.MOE_SUM.for_top_k(k) for k in (1, 2, 4, 5, 8)] == [
        TopKSum.FP32, TopKSum.SEQUENTIAL, TopKSum.SEQUENTIAL, TopKSum.FP32, TopKSum.FP32]
    structure = STRUCTURES["vllm_triton"]
    shape = dataclasses.replace(SHAPES["cpu"], num_experts=8, top_k=8, tokens=6)
    ckpt = make_checkpoint("bf16", "SILU", 8, shape.hidden_size, shape.intermediate_size, seed=1, with_bias=True)
    x, w, ids = case_inputs(shape, 1)
    out, trace = fused_moe(x, ckpt, w, ids, structure=structure, trace=True)
    bound = moe_error_bound(trace, ckpt)
    for topk_sum, should_pass in ((TopKSum.FP32, True), (TopKSum.SEQUENTIAL, False)):
        other = dataclasses.replace(structure, name=f"moe_sum_as_{topk_sum.name}", topk_sum=topk_sum)
        got = moe_emulation(x, ckpt, w, ids, structure=other, operand_dtype=torch.float32)
        assert compare(out, got, bound, other.name).ok is should_pass, other.name


def test_every_vllm_activation_rule_names_its_source_and_covers_every_activation():
    for name in ("vllm_triton", "vllm_triton_weight_on_input"):
        rules = STRUCTURES[name].activation_rules
        assert sorted(r.activation for r in rules) == sorted(ACTIVATIONS), name
        assert all(len(r.source) > 20 for r in rules)
    with pytest.raises(ValueError, match="ActivationRule.activation must be one of"):
        ActivationRule("SWIGLU", ActivationEval.FP32, "nowhere")
    with pytest.raises(ValueError, match="must name where the rule was read"):
        ActivationRule("SILU", ActivationEval.FP32, " ")
    rule = ActivationRule("SILU", ActivationEval.FP32, "a test")
    with pytest.raises(ValueError, match="names an activation twice"):
        NumericalStructure("twice", activation_rules=(rule, rule))


def test_a_structure_is_validated_field_by_field():
    with pytest.raises(TypeError, match=r"NumericalStructure.topk_sum must be a TopKSum .*got 'fp32'"):
        NumericalStructure("bad", topk_sum="fp32")
    with pytest.raises(ValueError, match="unknown numerical structure 'vllm'; expected one of"):
        structure_by_name("vllm")
    on_input = STRUCTURES["vllm_triton_weight_on_input"]
    with pytest.raises(ValueError, match="defined for top_k <= 1 only; got top_k=2"):
        on_input.check_top_k(2)
    ckpt = make_checkpoint("bf16", "SILU", 4, 128, 128)
    x, w, ids = case_inputs(SHAPES["cpu"], 0)
    with pytest.raises(ValueError, match="top_k <= 1 only; got top_k=3"):
        fused_moe(x, ckpt, w, ids, structure=on_input)
    assert structure_by_name(DEFAULT_STRUCTURE) is DEFAULT_STRUCTURE and DEFAULT_STRUCTURE.name == "vllm_triton"


def test_every_registered_backend_declares_a_valid_structure_explicitly():
    """The default (vllm_triton) is for outside backends that declare nothing; each built-in says its own."""
    for name, backend in registered_backends().items():
        assert "numerical_structure" in type(backend).__dict__ or hasattr(backend, "numerical_structure"), name
        assert isinstance(backend_structure(backend), NumericalStructure)

    class Undeclared:
        name = "undeclared"

    assert backend_structure(Undeclared()) is DEFAULT_STRUCTURE

    class Misdeclared:
        name = "misdeclared"
        numerical_structure = "fp32_everything"

    with pytest.raises(ValueError, match="backend 'misdeclared': numerical_structure: unknown numerical structure"):
        backend_structure(Misdeclared())


def test_the_structures_are_distinct_and_described():
    records = list(STRUCTURES.values())
    fields = [tuple(getattr(s, f) for f in FIELDS) for s in records]
    assert len(set(fields)) == len(records)
    assert all(s.description for s in records)
    sums = {s.topk_sum for s in records} | {s.topk_sum.for_top_k(k) for s in records for k in (1, 3, 8)}
    assert sums == set(TopKSum) and {s.router_weight for s in records} == set(RouterWeight)
    assert {s.fp8_static_scale for s in records} == set(ScaleApply)
    assert all(isinstance(v, enum.Enum) for s in records for v in (getattr(s, f) for f in FIELDS))
