"""The suites can fail: every reference mutant in tools/mutate_reference.py is caught."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_reference_mutant_is_caught():
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "mutate_reference.py")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SURVIVED" not in proc.stdout
