"""Benchmark session: collects every timed row and writes --bench-dir (the root conftest registers the
option, since pytest reads a sub-directory's conftest only after start-up: table, results.json, roofline);
each row also goes to DIR/rows.jsonl as soon as it is measured, so a run cut short keeps what it did."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path

import pytest


class _Rows(list):
    def __init__(self, out: str | None):
        super().__init__()
        self.jsonl = Path(out) / "rows.jsonl" if out else None
        if self.jsonl:
            self.jsonl.parent.mkdir(parents=True, exist_ok=True)
            self.jsonl.write_text("")

    def append(self, row: dict) -> None:
        super().append(row)
        if self.jsonl:
            with self.jsonl.open("a") as f:
                f.write(json.dumps(row) + "\n")


class _CutShort(KeyboardInterrupt):
    """SIGTERM (a CI step's or `timeout`'s limit) turned into the interrupt pytest ends a session on: the fixtures are
    torn down, so bench_rows still writes the report of the rows measured."""


_TERMINATED = []  # the signals received (the report says the run was cut short)


def _cut_short(signum, frame):
    _TERMINATED.append(signum)
    raise _CutShort(f"signal {signum}")


@pytest.fixture(scope="session")
def bench_rows(request):
    out = request.config.getoption("--bench-dir")
    rows = _Rows(out)
    main = threading.current_thread() is threading.main_thread()  # signal handlers: the main thread's only
    previous = signal.signal(signal.SIGTERM, _cut_short) if main else None
    try:
        yield rows
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
        if out and rows:
            from harness.bench import anchors, write_bench_report

            write_bench_report(list(rows), anchors(), out, cut_short=bool(_TERMINATED))
