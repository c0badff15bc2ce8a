"""Named corner cases with expected bytes (the test vectors of NUMERICS.md and the spec)."""

import pytest

from harness.inputs.strategies import CORNER_CASES


@pytest.mark.parametrize("case", CORNER_CASES, ids=lambda c: c.name)
def test_corner_case_bytes(case):
    got = case.compute()
    assert got == case.expected, (
        f"{case.name}: expected {[hex(b) for b in case.expected]}, got {[hex(b) for b in got]} ({case.why})"
    )
