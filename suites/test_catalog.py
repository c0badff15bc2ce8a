"""Detection power, in `make test`: every seeded-bug backend of the catalog (harness.catalog) fails the
conformance suite's own checks, and the correct base they all wrap passes every one of them - so each
mutant is caught for its bug. `python -m harness catalog` prints the same hunt as a table."""

from __future__ import annotations

import pytest

from harness.catalog import CONTROL, MUTANTS, hunt, make_mutant


def test_the_catalog_is_at_least_twenty_distinct_bug_classes():
    assert len(MUTANTS) >= 20 and len({m.name for m in MUTANTS}) == len(MUTANTS)
    assert len({m.bug for m in MUTANTS}) == len(MUTANTS)


@pytest.mark.parametrize("name", [m.name for m in MUTANTS])
def test_mutant_is_caught(name):
    catch, seconds, checks = hunt(make_mutant(name))
    assert catch is not None, f"mutant {name} survived all {checks} conformance checks ({seconds:.1f}s)"


def test_control_passes_every_check():
    catch, _, checks = hunt(make_mutant(CONTROL.name))
    assert catch is None, f"the correct base failed {catch.check}: {catch.message}"
    assert checks > 200  # it really ran the cases (cpu and gfx942 semantics)
