"""The CI definitions are code: the nightly matrix comes from the platform data, the workflows parse, and
they run what the README says (the PR workflow `make test`, each nightly leg `pytest -m <platform>`
under the nightly profile with its artifacts and its Hypothesis database)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from harness.outputs.matrix import HYPOTHESIS_DB_ARTIFACT, nightly_matrix
from harness.platforms import PLATFORMS

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"


def _load(name: str) -> dict:
    doc = yaml.safe_load((WORKFLOWS / name).read_text())
    doc["on"] = doc.pop(True, doc.get("on"))  # YAML 1.1 reads the bare key `on` as a boolean
    return doc


def _runs(job: dict) -> str:
    return "\n".join(step.get("run", "") for step in job["steps"])


def test_matrix_has_one_leg_per_gpu_platform_with_its_runner_labels():
    legs = nightly_matrix()["include"]
    assert [leg["platform"] for leg in legs] == [p.name for p in PLATFORMS.values() if p.is_gpu]
    for leg in legs:
        p = PLATFORMS[leg["platform"]]
        assert leg["runs-on"][0] == "self-hosted" and p.name in leg["runs-on"] and p.vendor in leg["runs-on"]
        assert leg["fp8"] == p.fp8_format.name
        assert leg["hypothesis-db"] == HYPOTHESIS_DB_ARTIFACT.format(platform=p.name)
    assert len({leg["hypothesis-db"] for leg in legs}) == len(legs)  # one database per leg, never clobbered


def test_matrix_command_prints_the_same_matrix_as_json():
    out = subprocess.run([sys.executable, "-m", "harness", "matrix"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    assert json.loads(out) == nightly_matrix()
    assert "\n" not in out.strip()  # one line: it goes into $GITHUB_OUTPUT as matrix=<json>


def test_nightly_workflow_runs_every_platform_leg_with_artifacts_and_database():
    wf = _load("nightly.yml")
    assert "schedule" in wf["on"] and "workflow_dispatch" in wf["on"]
    gen, gpu = wf["jobs"]["matrix"], wf["jobs"]["gpu"]
    assert "python -m harness matrix" in _runs(gen) and "GITHUB_OUTPUT" in _runs(gen)
    assert gen["outputs"]["matrix"] == "${{ steps.generate.outputs.matrix }}"
    assert gpu["needs"] == "matrix" and gpu["runs-on"] == "${{ matrix.runs-on }}"
    assert gpu["strategy"]["matrix"] == "${{ fromJSON(needs.matrix.outputs.matrix) }}"
    assert gpu["strategy"]["fail-fast"] is False  # one platform's failure must not hide another's
    runs = _runs(gpu)
    # every suite but the benchmarks, once, split over the conformance steps (each under 10 minutes on an H200)
    import re
    import shlex

    steps_run = [s["run"] for s in gpu["steps"] if "make conformance" in s.get("run", "")]
    assert all("PROFILE=nightly" in r and "REPORT=report/" in r for r in steps_run) and len(steps_run) >= 2
    assert len({re.search(r"REPORT=(\S+)", r).group(1) for r in steps_run}) == len(steps_run)  # no report overwrites
    covered = []
    for r in steps_run:
        args = shlex.split(re.search(r'SUITES="([^"]*)"', r).group(1))
        ignored = {a.removeprefix("--ignore=") for a in args if a.startswith("--ignore=")}
        for a in (a for a in args if not a.startswith("--")):
            files = sorted(ROOT.glob("suites/test_*.py")) if a == "suites" else [ROOT / a]
            covered += [f.relative_to(ROOT).as_posix() for f in files if f.relative_to(ROOT).as_posix() not in ignored]
    assert sorted(covered) == sorted(f.relative_to(ROOT).as_posix() for f in ROOT.glob("suites/test_*.py"))
    assert all(s.get("if") == "always()" for s in gpu["steps"] if "make conformance" in s.get("run", "")
               and s["run"] != steps_run[0])
    assert 'platforms --host)" = "${{ matrix.platform }}"' in runs  # a mislabelled runner fails the leg
    assert "make bench" in runs
    steps = gpu["steps"]
    names = [s.get("uses", "") for s in steps]
    restore = next(s for s in steps if s.get("uses", "").startswith("dawidd6/action-download-artifact"))
    assert restore["with"]["name"] == "${{ matrix.hypothesis-db }}" and restore["with"]["path"] == ".hypothesis/examples"
    uploads = [s for s in steps if s.get("uses", "").startswith("actions/upload-artifact")]
    assert all(s.get("if") == "always()" for s in uploads)  # failing legs upload too: that is when they matter
    paths = "\n".join(s["with"]["path"] for s in uploads)
    assert "report/" in paths and "bench/" in paths and ".hypothesis/examples" in paths
    assert any(s["with"]["name"] == "${{ matrix.hypothesis-db }}" for s in uploads)
    assert names.index(restore["uses"]) < min(i for i, s in enumerate(steps) if "make conformance" in s.get("run", ""))


def test_makefile_conformance_selects_the_host_platform_and_writes_the_report():
    make = (ROOT / "Makefile").read_text()
    assert '-m "$$($(PY) -m harness platforms --host)"' in make
    assert "--report=$(REPORT)" in make and "--junitxml=$(REPORT)/junit.xml" in make and "REPORT  ?= report" in make
    assert "--hypothesis-profile=$(PROFILE)" in make


def test_pr_workflow_runs_what_ci_runs():
    wf = _load("pr.yml")
    assert "pull_request" in wf["on"]
    job = wf["jobs"]["test"]
    assert _runs(job).strip() == ".ci/run"
    assert (ROOT / ".ci" / "run").read_text().strip().endswith("make test")


def test_the_makefiles_quark_pin_is_pyprojects():
    """make test installs AMD Quark without its dependencies (Makefile QUARK_PIN); pyproject's `quark` extra is the
    full install. One version in both."""
    import re
    import tomllib

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["quark"]
    pin = re.search(r"^QUARK_PIN := (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert pin and [pin.group(1)] == extra
