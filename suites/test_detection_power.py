"""The suites can fail: every reference mutant in tools/mutate_reference.py is caught (one test per
mutant, so that xdist spreads them over the workers). The backend catalog (harness/detection/catalog.py) is
asserted in suites/test_catalog.py."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("mutate_reference", ROOT / "tools" / "mutate_reference.py")
_tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_tool)
MUTANTS = _tool.MUTANTS


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_reference_mutant_is_caught(name, hypothesis_profile):
    if hypothesis_profile == "ci" and sorted(MUTANTS).index(name) % 2:
        pytest.skip("ci profile: every other reference mutant (a copy of the tree and a pytest run each, ~6 s; "
                    "dev and nightly: all)")
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "mutate_reference.py"), name], capture_output=True,
                          text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("CAUGHT"), proc.stdout + proc.stderr
