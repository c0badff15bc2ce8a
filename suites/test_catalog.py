"""Detection power, in `make test`: every seeded-bug backend of the catalog (harness.detection.catalog) fails the
conformance suite's own checks under every declared numerical structure, and the correct base they all
wrap passes every one of them under each structure - so each mutant is caught for its bug, whatever
structure the kernel has. `python -m harness catalog` prints the same hunt as a table."""

from __future__ import annotations

import pytest

from harness.detection.catalog import CONTROL, MUTANTS, SHAPE_MUTANTS, hunt, hunt_shapes, make_mutant
from reference.structure import STRUCTURES


def test_the_catalog_is_at_least_twenty_distinct_bug_classes():
    assert len(MUTANTS) >= 20 and len({m.name for m in MUTANTS}) == len(MUTANTS)
    assert len({m.bug for m in MUTANTS}) == len(MUTANTS)


@pytest.mark.parametrize("structure", list(STRUCTURES))
@pytest.mark.parametrize("name", [m.name for m in MUTANTS])
def test_mutant_is_caught(name, structure, hypothesis_profile):
    names, structures = [m.name for m in MUTANTS], list(STRUCTURES)
    if hypothesis_profile == "ci" and structures[names.index(name) % len(structures)] != structure:
        pytest.skip("ci profile: each mutant under one structure in turn, every structure under several mutants "
                    "(dev and nightly: every mutant under every structure)")
    catch, seconds, checks = hunt(make_mutant(name, structure))
    assert catch is not None, f"mutant {name} declaring {structure} survived all {checks} conformance checks ({seconds:.1f}s)"


@pytest.mark.parametrize("structure", list(STRUCTURES))
@pytest.mark.parametrize("name", [m.name for m in SHAPE_MUTANTS])
def test_shape_only_mutant_is_caught_by_the_shape_classes(name, structure, hypothesis_profile):
    """Bugs only real layers' shapes show (K tails, ids past 255, top_k past 8, tokens past 256, strided
    hidden_states, int32 ids): they pass all 240 default-shape checks (README, "Shape classes"), and the shape
    classes catch each under every structure (under the ci profile each mutant under one structure in turn)."""
    names, structures = [m.name for m in SHAPE_MUTANTS], list(STRUCTURES)
    if hypothesis_profile == "ci" and structures[names.index(name) % len(structures)] != structure:
        pytest.skip("ci profile: one structure per shape-only mutant in turn (dev and nightly run all)")
    cap = STRUCTURES[structure].max_top_k
    if name == "top_k_capped_at_8" and cap is not None and cap <= 8:
        pytest.skip(f"{structure} is defined for top_k <= {cap}: a kernel of it never runs top_k 9 or more")
    catch, seconds, checks = hunt_shapes(make_mutant(name, structure))
    assert catch is not None, f"shape-only mutant {name} declaring {structure} survived {checks} shape-class checks"


@pytest.mark.parametrize("structure", list(STRUCTURES))
def test_control_passes_every_shape_class(structure, hypothesis_profile):
    if hypothesis_profile == "ci" and structure != "vllm_triton":
        pytest.skip("ci profile: the control's shape classes under the default structure (dev and nightly: all)")
    catch, _, checks = hunt_shapes(make_mutant(CONTROL.name, structure))
    assert catch is None, f"the correct base declaring {structure} failed {catch.check}: {catch.message}"
    assert checks >= 45


@pytest.mark.parametrize("structure", list(STRUCTURES))
def test_control_passes_every_check(structure):
    catch, _, checks = hunt(make_mutant(CONTROL.name, structure))
    assert catch is None, f"the correct base declaring {structure} failed {catch.check}: {catch.message}"
    assert checks > 200  # it really ran the cases (cpu and gfx942 semantics)


def test_the_catalog_runs_the_same_checks_on_a_gpu_host(monkeypatch):
    """Issue 25: on the H200 the controls saw 48 checks (the simulated cpu cases were skipped as "same semantics
    as this machine's"); the catalog's hunt fixes its host to cpu, so a GPU host runs the same checks."""
    import types

    import harness.core.conformance as conformance
    import harness.detection.catalog as catalog
    from harness.platforms import PLATFORMS

    ran = []
    monkeypatch.setattr(catalog, "run_case", lambda b, case, shape, **kw: ran.append(case.id) or types.SimpleNamespace(
        ok=True, message=lambda: ""))
    monkeypatch.setattr(catalog, "quantizer_cases", lambda b: [])
    _, _, here = hunt(make_mutant(CONTROL.name))
    monkeypatch.setattr(conformance, "detect_platform", lambda: PLATFORMS["sm90"])
    _, _, on_gpu = hunt(make_mutant(CONTROL.name))
    assert on_gpu == here > 200 and ran[:here] == ran[here:]


def test_the_fp8_bias_bug_fails_most_elements_of_every_biased_case():
    """vLLM's bias-before-dequantization bug (PR 31676) must not hide among 8 of 32768 elements."""
    from harness.core.conformance import SHAPES, conformance_cases, run_case
    from harness.platforms import PLATFORMS

    mutant = make_mutant("fp8_bias_before_dequantization")
    biased = 0
    for case, reason in conformance_cases({mutant.name: mutant}, [PLATFORMS["cpu"]], host=PLATFORMS["cpu"]):
        if reason or case.scheme.name != "w_fp8_a_fp8":
            continue
        result = run_case(mutant, case, SHAPES["cpu"])
        biased += 1
        assert result.n_bad > result.n_total // 2, f"{case.id}: only {result.n_bad} of {result.n_total} elements"
    assert biased == 12  # every activation
