"""pytest side of the conformance report: `pytest --report DIR` collects every conformance case's outcome
(through xdist: the case test records its numbers with record_property, which travels with the test
report to the controller and into JUnit), prints a per platform x backend table at the end of the run,
and writes DIR/ (harness.outputs.report). Loaded by the project's conftest.py."""

from __future__ import annotations

import datetime
import json
import os
import platform as _py_platform
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from harness.core.oracle import all_platforms, format_oracle_table
from harness.outputs.report import (CASE_IDENTITY, CASE_PROPERTY, SHAPE_CLASS_PROPERTY, CaseResult, ReportModel, render_terminal,
                                    write_report)
from harness.platforms import host_info



def pytest_addoption(parser):
    group = parser.getgroup("moe-conformance")
    group.addoption("--report", metavar="DIR", default=None,
                    help="write the conformance report (Markdown, HTML, JSON, histograms) into DIR")


def _commit() -> str:
    """The commit under test: MOE_CONFORMANCE_COMMIT where the tree travels without its .git (a copied
    checkout may carry a stale one), else git's answer."""
    if os.environ.get("MOE_CONFORMANCE_COMMIT"):
        return os.environ["MOE_CONFORMANCE_COMMIT"]
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no git)"
    if subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True).stdout.strip():
        commit += " (with local changes)"
    return commit


class _Collector:
    def __init__(self, out_dir: Path):
        self.out_dir = out_dir
        self.cases: dict[str, CaseResult] = {}
        self.other = Counter()
        self.other_failures: list[dict] = []
        self.shape_classes: dict[str, dict] = {}
        self.written: dict[str, Path] = {}

    @staticmethod
    def _case(report) -> dict | None:
        """The case's identity, recorded as data at collection (harness.outputs.report.CASE_IDENTITY)."""
        for key, value in report.user_properties:
            if key == CASE_IDENTITY:
                return json.loads(value)
        return None

    @staticmethod
    def _first_line(report) -> str:
        if report.skipped and isinstance(report.longrepr, tuple):
            return str(report.longrepr[2]).removeprefix("Skipped: ")
        text = getattr(report, "longreprtext", "") or ""
        # pytest's assertion text: the message is the line starting with "E   "; keep the first one
        for line in text.splitlines():
            if line.startswith("E   "):
                return line[4:].strip()
        return text.strip().splitlines()[-1] if text.strip() else ""

    def pytest_runtest_logreport(self, report):
        case = self._case(report)
        if case is None:
            self._other(report)
            return
        platform, scheme, act, backend = case["platform"], case["scheme"], case["activation"], case["backend"]
        case_id = case["id"]
        if report.when == "setup" and report.skipped:
            outcome = "skipped"
        elif report.when == "setup" and report.failed or report.when == "teardown" and report.failed:
            outcome = "error"
        elif report.when == "call":
            outcome = "passed" if report.passed else "skipped" if report.skipped else "failed"
        else:
            return
        r = CaseResult(platform, scheme, act, backend, outcome, reason="" if outcome == "passed" else self._first_line(report),
                       seconds=report.duration)
        for key, value in report.user_properties:
            if key == CASE_PROPERTY:
                numbers = json.loads(value)
                r.worst_ulps, r.max_ratio = numbers["worst_ulps"], numbers["max_ratio"]
                r.n_bad, r.n_total, r.ratio_histogram = numbers["n_bad"], numbers["n_total"], numbers["ratio_histogram"]
                r.false_alarm = numbers.get("false_alarm", 0.0)
        self.cases[case_id] = r

    def _shape_class(self, report) -> None:
        """Tally test_shape_class outcomes per backend (the report's shape-class table)."""
        for key, value in report.user_properties:
            if key == SHAPE_CLASS_PROPERTY and report.when == "call":
                info = json.loads(value)
                t = self.shape_classes.setdefault(info["backend"], {"passed": 0, "failed": 0, "declined": 0, "reasons": {}})
                if info.get("declined") or report.skipped:  # supports() or prepare() declined
                    t["declined"] += 1
                    reason = self._first_line(report)
                    t["reasons"][reason] = t["reasons"].get(reason, 0) + 1
                elif report.passed or report.failed:
                    t["passed" if report.passed else "failed"] += 1
                return

    def _other(self, report):
        self._shape_class(report)
        if report.when == "call":
            self.other[report.outcome] += 1
        elif report.skipped:
            self.other["skipped"] += 1
        elif report.failed:
            self.other["error"] += 1
        else:
            return
        if report.failed:
            self.other_failures.append(dict(nodeid=report.nodeid, message=self._first_line(report)))

    def meta(self, config) -> dict:
        host = host_info()
        commit = _commit()
        other = ", ".join(f"{n} {k}" for k, n in sorted(self.other.items())) or "none"
        return dict(platform=host.platform.name, device=host.device_name, torch=host.torch_version,
                    triton=host.triton_version, python=_py_platform.python_version(), commit=commit,
                    date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                    command="pytest " + " ".join(sys.argv[1:]) if sys.argv else "pytest",
                    hypothesis_profile=config.getoption("--hypothesis-profile", None) or "",
                    other_tests=other, other_failures=self.other_failures, shape_classes=self.shape_classes)

    def pytest_sessionfinish(self, session):
        dispatch = format_oracle_table(all_platforms(), session.config.moe_backends)
        self.written = write_report(list(self.cases.values()), self.out_dir, self.meta(session.config), dispatch)

    def pytest_terminal_summary(self, terminalreporter):
        tr = terminalreporter
        tr.section("conformance summary")
        model = ReportModel.build(list(self.cases.values()), {}, "")
        for line in render_terminal(model):
            tr.write_line(line)
        for kind, path in self.written.items():
            if not kind.startswith("histogram:"):
                tr.write_line(f"report {kind}: {path}")


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    out = config.getoption("--report", None)
    if out and Path(out).exists() and not Path(out).is_dir():  # say so now, not after the whole run
        raise pytest.UsageError(f"--report {out}: is an existing file; --report wants a directory to write into")
    if out and not hasattr(config, "workerinput"):  # the controller (or a run without xdist) writes it
        config.pluginmanager.register(_Collector(Path(out)), "moe-conformance-report")
