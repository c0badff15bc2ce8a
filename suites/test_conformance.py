"""The conformance suite: every backend x platform x scheme x activation against the reference computed
with the backend's declared numerical structure, within the derived bound. Unsupported combinations are
skipped with the backend's reason (decided in harness.core.conformance.skip_reason, at collection); a
checkpoint that prepare() declines (NotImplementedError) is a skip with its reason, in every test here."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, Phase, assume, example, given, note, settings, target
from hypothesis import strategies as st

from harness.backends import Declined, backend_available, known_failure_for
from harness.core.conformance import (ROUTINGS, SHAPE_CLASS_SCHEMES, case_problem, conformance_cases, conformance_shape, runs_with_bias,
                                      moe_property_examples, quantizer_cases, quantizer_property, run_case,
                                      run_drawn_case,
                                      run_shape_class_case, shape_class_runs)
from harness.inputs.shape_classes import SHAPE_CLASSES
from harness.platforms import PLATFORMS, detect_platform
from harness.outputs.report import CASE_PROPERTY, SHAPE_CLASS_PROPERTY, case_properties
from harness.outputs.repro import write_case_repro


def _shape():
    return conformance_shape(detect_platform())  # a given checkpoint's sizes (--checkpoint), else the platform's


def test_conformance(conformance_case, backends, record_property, request):
    backend = backends[conformance_case.backend_name]
    try:
        result = run_case(backend, conformance_case, _shape())
    except Declined as declined:  # a declared limitation, reported, never a wrong answer
        pytest.skip(str(declined))
    record_property(CASE_PROPERTY, case_properties(result))  # for the report (harness.outputs.pytest_plugin)
    problem, _, _ = case_problem(backend, conformance_case.scheme, conformance_case.activation,
                                 conformance_case.platform, _shape())
    known = known_failure_for(backend, conformance_case.scheme.name, runs_with_bias(problem))
    if known:  # strict: a pass means the upstream fix has landed and the record must go
        if result.ok:
            pytest.fail(f"{conformance_case.id} passes, declared a known failure ({known.reason}): either the upstream "
                        f"fix has landed ({known.upstream}) and the record must go, or this case no longer catches "
                        f"the bug (margin {result.max_ratio:.2f} of the bound)")
        pytest.xfail(f"known failure of {backend.name}: {known.reason} ({known.upstream})\n{result.message()}")
    repro_dir = request.config.getoption("--repro")
    if not result.ok and repro_dir:
        spec = request.config.moe_backend_specs.get(backend.name, backend.name)
        folder = write_case_repro(repro_dir, spec, backend, conformance_case, _shape())
        assert result.ok, f"{result.message()}\n  reproducer: python {folder / 'repro.py'}"
    assert result.ok, result.message()


@pytest.mark.parametrize("scheme", SHAPE_CLASS_SCHEMES)
@pytest.mark.parametrize("shape_class", list(SHAPE_CLASSES))
def test_shape_class(backend_name, backends, shape_class, scheme, hypothesis_profile, record_property):
    """The properties real layers have that kernels break on (harness.inputs.shape_classes: K tails, expert ids
    past 255 and the last one, top_k 1 and 10, 257 tokens, skewed routing, a strided hidden_states view at a
    storage offset, int32 ids), one scheme per block family, at interpreter cost. A backend that declines a
    class says why (a skip with its reason, tallied per backend in the report). Under the ci profile each backend
    runs every other class (alternating between backends) with one scheme, taken in turn from the class's
    position; every other profile runs every class with every scheme."""
    backend, host = backends[backend_name], detect_platform()
    ok, why = backend_available(backend, host)
    if not ok:
        pytest.skip(f"{backend_name} on this {host.name} machine: {why}")
    if hypothesis_profile == "ci":
        if not getattr(backend, "ci_breadth", True):
            pytest.skip(f"ci profile: {backend_name} runs the explicit cases only (ci_breadth False: a release kept "
                        "for its known failure); dev and nightly run its shape classes")
        classes, names = list(SHAPE_CLASSES), sorted(backends)
        if (classes.index(shape_class) + names.index(backend_name)) % 2:
            pytest.skip(f"ci profile: {backend_name} runs every other shape class (the other half by the next "
                        "backend); dev and nightly run all")
        chosen = ci_shape_class_scheme(backend, shape_class, host)
        if chosen != scheme:
            pytest.skip(f"ci profile: {backend_name} runs {shape_class} with {chosen} (one scheme per class in turn; "
                        "--hypothesis-profile dev or nightly runs every scheme)")
    runs = shape_class_runs(backend, scheme, SHAPE_CLASSES[shape_class], host)  # recorded before a crash can happen
    record_property(SHAPE_CLASS_PROPERTY, json.dumps(dict(backend=backend_name, shape_class=shape_class, scheme=scheme,
                                                          declined=isinstance(runs, str))))
    result = runs if isinstance(runs, str) else run_shape_class_case(backend, scheme, SHAPE_CLASSES[shape_class], host)
    if isinstance(result, str):
        pytest.skip(result)
    known = known_failure_for(backend, scheme, True)
    if known and not result.ok:  # the explicit cases hold the record strictly; here it only explains
        pytest.xfail(f"known failure of {backend.name}: {known.reason} ({known.upstream})\n{result.message()}")
    assert result.ok, result.message()


def ci_shape_class_scheme(backend, shape_class: str, host) -> str | None:
    """The one scheme the ci profile runs for this backend at this class: SHAPE_CLASS_SCHEMES rotated by the
    class's position, the first that runs here (None: none does)."""
    i = list(SHAPE_CLASSES).index(shape_class)
    order = SHAPE_CLASS_SCHEMES[i % len(SHAPE_CLASS_SCHEMES):] + SHAPE_CLASS_SCHEMES[:i % len(SHAPE_CLASS_SCHEMES)]
    return next((s for s in order if not isinstance(shape_class_runs(backend, s, SHAPE_CLASSES[shape_class], host),
                                                    str)), None)


def runnable_cases(backend):
    """(scheme, activation, platform) combinations the conformance suite runs for this backend here (the
    one decision: harness.core.conformance.skip_reason), less the declared known failures (the explicit
    cases run those)."""
    out = []
    for case, reason in conformance_cases({backend.name: backend}):
        if reason is not None:
            continue
        problem, _, _ = case_problem(backend, case.scheme, case.activation, case.platform, _shape())
        if not known_failure_for(backend, case.scheme.name, runs_with_bias(problem)):
            out.append((case.scheme.name, case.activation.name, case.platform.name))
    return out


@pytest.fixture
def runnable(backend_name, backends):
    """(scheme, activation, platform) triples the backend runs here; skips (before Hypothesis starts)
    when there are none."""
    cases = runnable_cases(backends[backend_name])
    if not cases:
        pytest.skip(f"{backend_name} can run nothing on this machine")
    return cases


# the fixtures are constant per backend: sharing them across examples is intended. The nightly legs search
# NIGHTLY_MOE_EXAMPLES of each of the two properties below per backend (two tests, so that xdist runs them side by
# side: one property of 200 examples was the leg's longest test); dev and ci draw 12 of the first (the Triton
# interpreter's cost), and of the second dev draws 6 and ci runs only its explicit examples (test_shape_class
# covers the classes)
_PROFILE = settings.get_current_profile_name()
_SLOW_OK = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large,
            HealthCheck.filter_too_much]


def _judge(result):
    if isinstance(result, str):  # an unsupported shape or a declined checkpoint: never run there
        note(result)
        assume(False)
        return
    target(min(result.max_ratio, 1e6), label="worst |kernel - reference| / bound")
    assert result.ok, result.message()


@settings(max_examples=moe_property_examples(12), suppress_health_check=_SLOW_OK)
@given(case=st.integers(0, 2**16), seed=st.integers(0, 2**16), tokens=st.integers(0, 10), top_k=st.integers(1, 4),
       routing=st.sampled_from(ROUTINGS))
# Pinned corner inputs, run for every backend in every profile; a failure the nightly database finds
# gets its @example here too (the database alone is not in git).
@example(case=0, seed=0, tokens=0, top_k=3, routing="random")  # zero tokens: an empty grid
@example(case=7, seed=3, tokens=1, top_k=1, routing="all_to_one")  # one token, one expert
@example(case=11, seed=5, tokens=10, top_k=4, routing="skip_experts")  # experts 0..E-k-1 idle
def test_conformance_hypothesis(backend_name, backends, runnable, case, seed, tokens, top_k, routing):
    """Random problems, token counts (zero included), top-k (1 to 4: the structures differ in how they sum
    three or more terms) and skewed routing for each backend, at the platform's shape. Under the nightly
    profile, target() steers generation toward the largest error relative to the bound."""
    scheme, act, platform = runnable[case % len(runnable)]
    _judge(run_drawn_case(backends[backend_name], scheme, act, PLATFORMS[platform], _shape(), seed, tokens, top_k,
                          routing))


@settings(max_examples=moe_property_examples(6 if _PROFILE == "dev" else 1), suppress_health_check=_SLOW_OK,
          **({"phases": [Phase.explicit]} if _PROFILE == "ci" else {}))
@given(case=st.integers(0, 2**16), seed=st.integers(0, 2**16), shape_class=st.sampled_from(list(SHAPE_CLASSES)))
@example(case=1, seed=0, shape_class="k_tails_gpt-oss-120b_tp2")  # real layers
def test_shape_class_hypothesis(backend_name, backends, runnable, case, seed, shape_class):
    """A shape class (harness.inputs.shape_classes: its own experts, H, I, tokens, top_k, routing and input layout)
    with a drawn problem and seed, so that the shared database keeps what the search finds there too."""
    scheme, _, platform = runnable[case % len(runnable)]
    note(f"shape class {shape_class}: {SHAPE_CLASSES[shape_class]}")
    _judge(run_shape_class_case(backends[backend_name], scheme, SHAPE_CLASSES[shape_class], PLATFORMS[platform],
                                seed % 4))


def test_backend_quantizer_entry_points_are_bit_exact(backend_name, backends):
    """Optional entry points (quantize_mx / quantize_nvfp4 / quantize_fp8) must return the reference's
    bytes: codes and scales, bit for bit. NotImplementedError from an entry point means unsupported.
    (The Hypothesis property lives in harness.core.conformance: the seeded-bug catalog runs it too.)"""
    backend = backends[backend_name]
    if not quantizer_cases(backend):
        pytest.skip(f"{backend_name} exposes no quantizer entry points")
    quantizer_property(backend, settings(max_examples=30))()
