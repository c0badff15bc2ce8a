"""The conformance suite: every backend x platform x scheme x activation against the reference, within
the derived bound. Unsupported combinations are skipped with the backend's reason (decided in
harness.conformance.skip_reason, at collection)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, example, given, note, settings, target
from hypothesis import strategies as st

from harness.conformance import (SHAPES, _checkpoint, case_inputs, compare_backend, problem_for, quantizer_cases,
                                 quantizer_property, run_case)
from harness.platforms import PLATFORMS, detect_platform
from harness.tolerances import compare, moe_error_bound
from harness.report import CASE_PROPERTY, case_properties
from reference.activations import ACTIVATIONS
from reference.moe import fused_moe
from reference.schemes import SCHEMES

def _shape():
    return SHAPES["gpu" if detect_platform().is_gpu else "cpu"]


def test_conformance(conformance_case, backends, record_property):
    result = run_case(backends[conformance_case.backend_name], conformance_case, _shape())
    record_property(CASE_PROPERTY, case_properties(result))  # for the report (harness.pytest_plugin)
    assert result.ok, result.message()


def _runnable(backend):
    """(scheme, activation, platform) combinations this backend supports and can run here."""
    out = []
    for p in PLATFORMS.values():
        if not getattr(backend, "available", lambda _p: (True, ""))(p)[0]:
            continue
        out += [(s, a, p.name) for s in sorted(SCHEMES) for a in sorted(ACTIVATIONS) if backend.supports(problem_for(s, a), p)[0]]
    return out


@pytest.fixture
def runnable(backend_name, backends):
    """(scheme, activation, platform) triples the backend runs here; skips (before Hypothesis starts)
    when there are none."""
    cases = _runnable(backends[backend_name])
    if not cases:
        pytest.skip(f"{backend_name} can run nothing on this machine")
    return cases


# the fixtures are constant per backend: sharing them across examples is intended
@settings(max_examples=12, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                                  HealthCheck.data_too_large])
@given(
    case=st.integers(0, 2**16),
    seed=st.integers(0, 2**16),
    tokens=st.integers(0, 10),
    routing=st.sampled_from(["random", "all_to_one", "skip_experts"]),
)
# Pinned corner inputs, run for every backend in every profile; a failure the nightly database finds
# gets its @example here too (the database alone is not in git).
@example(case=0, seed=0, tokens=0, routing="random")  # zero tokens: an empty launch grid
@example(case=7, seed=3, tokens=1, routing="all_to_one")  # one token on experts 0..k-1
@example(case=11, seed=5, tokens=10, routing="skip_experts")  # experts 0..E-k-1 get no token
def test_conformance_hypothesis(backend_name, backends, runnable, case, seed, tokens, routing):
    """Random problems, token counts (zero included) and skewed routing for each backend. Under the
    nightly profile, target() steers generation toward the largest error relative to the bound."""
    backend = backends[backend_name]
    scheme, act, platform = runnable[case % len(runnable)]
    note(f"case: {scheme}/{act}/{platform}")
    p = PLATFORMS[platform]
    shape = _shape()
    ckpt = _checkpoint(scheme, act, p.fp8_format.name, shape, seed % 4)
    x, w, ids = case_inputs(shape, seed, tokens)
    if routing == "all_to_one":
        ids = torch.arange(shape.top_k).repeat(tokens, 1)
    elif routing == "skip_experts":  # only the last top_k experts get tokens
        ids = torch.arange(shape.num_experts - shape.top_k, shape.num_experts).repeat(tokens, 1)
    out, trace = fused_moe(x, ckpt, w, ids, trace=True)
    result = compare_backend(backend, ckpt, (x, w, ids), out, trace, f"{scheme}/{act}/{backend_name}/{platform}")
    target(min(result.max_ratio, 1e6), label="worst |kernel - reference| / bound")
    assert result.ok, result.message()


def test_backend_quantizer_entry_points_are_bit_exact(backend_name, backends):
    """Optional entry points (quantize_mx / quantize_nvfp4 / quantize_fp8) must return the reference's
    bytes: codes and scales, bit for bit. NotImplementedError from an entry point means unsupported.
    (The Hypothesis property lives in harness.conformance: the seeded-bug catalog runs it too.)"""
    backend = backends[backend_name]
    if not quantizer_cases(backend):
        pytest.skip(f"{backend_name} exposes no quantizer entry points")
    quantizer_property(backend, settings(max_examples=30))()


def test_extreme_mx_weight_scales(backend_name, backends):
    """MX weights whose every w2 block scale is 2^-127 (code 0: weights and outputs are fp32/bf16
    subnormals, which a flush-to-zero kernel loses) or 2^13 must give the reference's output too. The
    test first shows that a flushed result would fail."""
    backend = backends[backend_name]
    host = detect_platform()
    schemes = [s for s, a, p in _runnable(backend) if p == host.name and a == "SILU" and s in ("w_mxfp4", "w_mxfp8")]
    if not schemes:
        pytest.skip(f"{backend_name} runs no MX-weight scheme with SILU here")
    shape = _shape()
    x, w, ids = case_inputs(shape, 5)
    for scheme in schemes:
        base = _checkpoint(scheme, "SILU", host.fp8_format.name, shape, 0)
        for code in (0, 140):
            scale = torch.full_like(base.w2.scale, code)
            ckpt = dataclasses.replace(base, w2=dataclasses.replace(base.w2, scale=scale))
            out, trace = fused_moe(x, ckpt, w, ids, trace=True)
            if code == 0:
                flushed = torch.zeros_like(out)  # what flush-to-zero of the subnormal weights would give
                assert not compare(out, flushed, moe_error_bound(trace, ckpt), "flushed").ok
            what = f"{scheme}/SILU/{backend_name}/w2 scales 2^{code - 127}"
            try:
                result = compare_backend(backend, ckpt, (x, w, ids), out, trace, what)
            except NotImplementedError as declined:  # a declared limitation, reported, never a wrong answer
                pytest.skip(f"{what}: declined: {declined}")
            assert result.ok, result.message()
