"""Benchmark session: collects every timed row and writes --bench-dir (the root conftest registers the
option, since pytest reads a sub-directory's conftest only after start-up: table, results.json, roofline);
each row also goes to DIR/rows.jsonl as soon as it is measured, so a run cut short keeps what it did."""

from __future__ import annotations

import json
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


@pytest.fixture(scope="session")
def bench_rows(request):
    out = request.config.getoption("--bench-dir")
    rows = _Rows(out)
    yield rows
    if out and rows:
        from harness.bench import anchors, write_bench_report

        write_bench_report(list(rows), anchors(), out)
