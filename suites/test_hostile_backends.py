"""A harness no backend can fool or stall: each hostile backend of examples/hostile_backends.py fails
alone, with a message that says what it did, while a correct backend run beside it in the same pytest
process still passes; bad --backend and --report values are one clear line at start."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.platforms import detect_platform

ROOT = Path(__file__).resolve().parents[1]
HOST = detect_platform().name  # cases of other platforms' semantics skip on a host that runs them natively
CASE = f"w_mxfp4/SILU/ and {HOST} and not hypothesis"

# factory -> (backend name in the case id, what the failure must say)
HOSTILE = {
    "mutates_hidden_states": ("a_mutates_hidden_states", r"forward\(\) modified hidden_states in place"),
    "mutates_router_weights": ("a_mutates_router_weights", r"forward\(\) modified topk_weights in place"),
    "mutates_checkpoint": ("a_mutates_checkpoint", r"prepare\(\) modified ckpt\.w13\.data in place"),
    "hangs": ("hangs", r"forward\(\): no result within the case time limit of 3 s"),
    "supports_returns_bool": ("supports_bool", r"backend 'supports_bool': supports\(\) must return \(bool, str\), got True"),
    "supports_returns_none": ("supports_none", r"backend 'supports_none': supports\(\) must return \(bool, str\), got None"),
    "supports_returns_a_string": ("supports_string", r"supports\(\) must return \(bool, str\), got 'no'"),
    "wrong_output_shape": ("wrong_shape", r"forward\(\) must return hidden_states' shape \((\d+), (\d+)\), got \(\1, \d+\)"),
    "wrong_output_dtype": ("wrong_dtype", r"forward\(\) must return bfloat16, got torch.float32"),
    "nan_output": ("nan_output", r"1 of \d+ elements out of bound.*1 NaN/Inf where the reference is finite"),
    "raises": ("raises", r"RuntimeError: CUDA error: an illegal memory access"),
}


def _pytest(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--hypothesis-profile=ci", "-q", "-rA", *args],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, "COLUMNS": "2000", **(env or {})}, timeout=300,
    )


@pytest.fixture(scope="module")
def hostile_run():
    specs = [a for f in HOSTILE for a in ("--backend", f"examples.hostile_backends:{f}")]
    return _pytest("suites/test_conformance.py", "-k", CASE, *specs, "--backend", "examples.simple_backend:make_backend",
                   env={"MOE_CONFORMANCE_CASE_TIMEOUT": "3"})


@pytest.mark.parametrize("factory", sorted(HOSTILE))
def test_each_hostile_backend_fails_alone_with_a_message_that_says_what_it_did(hostile_run, factory):
    name, pattern = HOSTILE[factory]
    line = next((ln for ln in hostile_run.stdout.splitlines()
                 if ln.startswith(("FAILED", "ERROR")) and f"[w_mxfp4/SILU/{name}/{HOST}]" in ln), None)
    assert line is not None, hostile_run.stdout[-3000:]
    assert re.search(pattern, line), line


def test_a_correct_backend_beside_them_still_passes(hostile_run):
    assert re.search(rf"^PASSED suites/test_conformance.py::test_conformance\[w_mxfp4/SILU/simple_example/{HOST}\]",
                     hostile_run.stdout, re.M), hostile_run.stdout[-3000:]
    last = hostile_run.stdout.strip().splitlines()[-1]
    assert f"{len(HOSTILE)} failed" in last and "1 passed" in last, last


@pytest.mark.parametrize("spec, words", [
    ("no_such_module:make", "backend 'no_such_module:make': cannot import 'no_such_module' (ModuleNotFoundError"),
    ("examples.hostile_backends:NOT_A_FACTORY", "examples.hostile_backends.NOT_A_FACTORY is a int, not a factory"),
    ("examples.hostile_backends:missing", "module 'examples.hostile_backends' has no 'missing'"),
    ("examples.hostile_backends:name_with_a_slash", "name 'vendor/kernel' must be a non-empty str of letters"),
    ("examples.hostile_backends:_Hostile", "_Hostile.__init__() missing 1 required positional argument"),
    ("examples.hostile_backends:factory_raises", "--backend examples.hostile_backends:factory_raises: RuntimeError: "
                                                 "this backend needs a device"),
])
def test_a_bad_backend_spec_is_one_clear_line_at_start(spec, words):
    proc = _pytest("suites/test_conformance.py", "--backend", spec, "--co")
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]  # pytest's usage error
    assert "INTERNALERROR" not in proc.stderr + proc.stdout
    assert words in proc.stderr, proc.stderr


@pytest.mark.parametrize("args, words", [
    (["--case-timeout", "-1"], "--case-timeout -1: must be a number of seconds >= 0"),
    (["--repro", "README.md"], "--repro README.md: is an existing file"),
    (["--backend", "triton_emulation", "--backend", "harness.backends.triton_emulation:make_backend"],
     "both make a backend named 'triton_emulation'"),
    (["--hypothesis-profile", "bogus"], "--hypothesis-profile bogus: expected one of dev, ci, nightly"),
], ids=["negative_case_timeout", "repro_is_a_file", "two_specs_one_name", "unknown_profile"])
def test_a_bad_option_is_one_clear_line_at_start(args, words):
    """Issue 26: each of these was an itimer error, a NotADirectoryError in place of the failure, a silent
    replacement of one backend by another, or an INTERNALERROR."""
    proc = _pytest("suites/test_conformance.py", "--co", *args)
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "INTERNALERROR" not in proc.stderr + proc.stdout
    assert words in proc.stderr, proc.stderr


def test_a_factory_that_returns_the_class_is_told_to_call_it():
    from harness.backends import load_backend

    with pytest.raises(TypeError, match="the factory returned the class SimpleBackend, not an instance; return "
                                        r"SimpleBackend\(\)"):
        load_backend("examples.simple_backend:make_class")


def test_report_pointing_at_an_existing_file_fails_at_start(tmp_path):
    existing = tmp_path / "report.txt"
    existing.write_text("not a directory")
    proc = _pytest("suites/test_conformance.py", "--co", "--report", str(existing))
    assert proc.returncode == 4 and f"--report {existing}: is an existing file" in proc.stderr


def test_a_corrupted_hypothesis_database_is_tolerated(tmp_path):
    db = tmp_path / "db"
    (db / "0123456789abcdef").mkdir(parents=True)
    (db / "0123456789abcdef" / "garbage").write_bytes(b"\\x00\\xff not an example")
    (db / "not-a-dir").write_text("junk")
    proc = _pytest("suites/test_conformance.py", "-k", "hypothesis and torch_emulation", "--hypothesis-profile=dev",
                   "--backend", "torch_emulation", env={"MOE_CONFORMANCE_HYPOTHESIS_DB": str(db)})
    assert proc.returncode == 0, proc.stdout[-2000:]
