"""The suites can fail: every reference mutant in tools/mutate_reference.py is caught, and every
seeded-bug backend of the catalog (harness/catalog.py) fails the conformance suite while its correct
base passes."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_reference_mutant_is_caught():
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "mutate_reference.py")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SURVIVED" not in proc.stdout


def test_every_catalog_mutant_is_caught_and_the_control_passes():
    proc = subprocess.run([sys.executable, "-m", "harness", "catalog", "--workers", "2"], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "SURVIVED" not in proc.stdout and "control (no bug): passed" in proc.stdout
