"""The suites can fail: every reference mutant in tools/mutate_reference.py is caught.

The backend catalog (harness/catalog.py, 21 seeded-bug backends) is run by `make catalog`, not here:
with it `make test` took 8.6 minutes on the 2-core CI machine, too close to its 10-minute budget."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_reference_mutant_is_caught():
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "mutate_reference.py")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SURVIVED" not in proc.stdout

