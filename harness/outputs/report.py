"""The conformance report (`make conformance` writes it to report/): what ran, on which platform, with
which result, and how close to its bound each backend came.

  results.json     every case (platform, scheme, activation, backend, outcome, reason, worst error in
                   bf16 ulps and as a fraction of the derived bound, histogram) plus host and run metadata
  summary.md       the same as tables: per platform x backend counts, failures, the case matrix, skip
                   reasons, the dispatch table, links to the histograms
  index.html       one self-contained page (inline CSS, histograms embedded as data: URIs)
  histograms/*.png one per scheme: |kernel - reference| / bound per output element, per backend
  junit.xml        written by pytest itself (--junitxml), beside the rest

The pytest side (collecting results through xdist) is harness.outputs.pytest_plugin; this module only turns
records into files, so it can be tested and re-rendered from a results.json.
"""

from __future__ import annotations

import base64
import html
import json
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.core.tolerances import RATIO_LOG2_MAX, RATIO_LOG2_MIN, Comparison

__all__ = ["CaseResult", "ReportModel", "case_properties", "case_identity", "write_report", "load_results",
           "render_markdown", "render_html", "render_terminal", "OUTCOMES", "CASE_PROPERTY", "CASE_IDENTITY",
           "SHAPE_CLASS_PROPERTY", "shape_class_rows"]

OUTCOMES = ("passed", "failed", "error", "skipped")
CASE_PROPERTY = "moe_case"  # the user_properties key the conformance test records its result under
CASE_IDENTITY = "moe_case_identity"  # ... and the key its identity is recorded under at collection
SHAPE_CLASS_PROPERTY = "moe_shape_class"  # test_shape_class records {backend, shape_class, scheme, declined} here


@dataclass
class CaseResult:
    platform: str
    scheme: str
    activation: str
    backend: str
    outcome: str  # one of OUTCOMES
    reason: str = ""  # skip reason, or the failure message
    worst_ulps: float | None = None
    max_ratio: float | None = None  # worst |kernel - reference| / bound (<= 1 passes)
    n_bad: int = 0
    n_total: int = 0
    seconds: float = 0.0
    ratio_histogram: list[int] = field(default_factory=list)
    false_alarm: float = 0.0  # the bound's probability of failing a correct kernel (ErrorBound.false_alarm)

    @property
    def key(self) -> tuple[str, str, str, str]:
        return self.platform, self.scheme, self.activation, self.backend


def case_identity(case) -> str:
    """What the conformance suite records for each case at collection (a ConformanceCase): the report
    reads the case from it, never from the test id."""
    return json.dumps(dict(id=case.id, platform=case.platform.name, scheme=case.scheme.name,
                           activation=case.activation.name, backend=case.backend_name))


def case_properties(comparison: Comparison) -> str:
    """What the conformance test records (pytest's record_property: it crosses xdist and lands in JUnit)."""
    return json.dumps(dict(worst_ulps=comparison.worst_ulps, max_ratio=comparison.max_ratio,
                           n_bad=comparison.n_bad, n_total=comparison.n_total,
                           ratio_histogram=list(comparison.ratio_histogram), false_alarm=comparison.false_alarm))


# ---- rendering -------------------------------------------------------------------------------------


def _fmt_ulps(r: CaseResult) -> str:
    if r.worst_ulps is None:
        return ""
    return "inf" if r.worst_ulps == float("inf") else f"{r.worst_ulps:.3g}"


def _cell_text(r: CaseResult | None) -> str:
    if r is None:
        return ""
    if r.outcome == "passed":
        return f"pass {_fmt_ulps(r)} ulp ({r.max_ratio:.2f})"
    if r.outcome in ("failed", "error"):
        return f"**{r.outcome.upper()}** {_fmt_ulps(r)} ulp" if r.worst_ulps is not None else f"**{r.outcome.upper()}**"
    return "skip"


def _ran(results: list[CaseResult]) -> list[CaseResult]:
    return [r for r in results if r.outcome != "skipped"]


def _histogram_bins() -> list[str]:
    return ["exact", f"<2^{RATIO_LOG2_MIN}"] + [f"2^{k}" for k in range(RATIO_LOG2_MIN, RATIO_LOG2_MAX)] + [
        f">=2^{RATIO_LOG2_MAX}"]


def write_histograms(results: list[CaseResult], out_dir: Path) -> dict[str, Path]:
    """One PNG per scheme: per backend, how many output elements landed at each |error| / bound."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per_scheme: dict[str, dict[str, list[int]]] = defaultdict(dict)
    for r in _ran(results):
        if not r.ratio_histogram:
            continue
        acc = per_scheme[r.scheme].setdefault(r.backend, [0] * len(r.ratio_histogram))
        for i, c in enumerate(r.ratio_histogram):
            acc[i] += c
    out_dir.mkdir(parents=True, exist_ok=True)
    labels = _histogram_bins()
    paths = {}
    for scheme, by_backend in sorted(per_scheme.items()):
        fig, ax = plt.subplots(figsize=(8, 3.2), dpi=100)
        width = 0.8 / max(1, len(by_backend))
        for j, (backend, counts) in enumerate(sorted(by_backend.items())):
            xs = [i + (j - (len(by_backend) - 1) / 2) * width for i in range(len(counts))]
            ax.bar(xs, counts, width=width, label=backend)
        ax.set_yscale("symlog", linthresh=1)
        bound_at = labels.index("2^0") - 0.5  # the 2^0 bin holds [1, 2) x the bound: failures but for 1
        ax.axvline(bound_at, color="crimson", linestyle="--", linewidth=1)
        ax.text(bound_at + 0.1, 1.5, "bound", color="crimson", fontsize=8)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=60, fontsize=7)
        ax.set_xlabel("|kernel - reference| / derived bound (per output element)")
        ax.set_ylabel("elements")
        ax.set_title(f"{scheme}: error as a fraction of the bound", fontsize=10)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / f"{scheme}.png"
        fig.savefig(path)
        plt.close(fig)
        paths[scheme] = path
    return paths


@dataclass
class SummaryRow:
    platform: str
    backend: str
    passed: int
    failed: int  # failed + error
    skipped: int
    worst_ulps: float | None

    @property
    def ran(self) -> bool:
        return self.passed + self.failed > 0

    @property
    def worst_text(self) -> str:
        return "" if self.worst_ulps is None else f"{self.worst_ulps:.3g}"


@dataclass
class PlatformMatrix:
    platform: str
    backends: list[str]  # those that ran at least one case here
    rows: list[tuple[tuple[str, str], dict[str, CaseResult]]]  # ((scheme, activation), {backend: result})


@dataclass
class ReportModel:
    """Everything a report shows, computed once; render_markdown, render_html and the terminal summary
    only format it."""

    meta: dict
    dispatch: str
    totals: Counter  # outcome -> cases
    summary: list[SummaryRow]
    failures: list[tuple[str, str]]  # (what, message): failed cases first, then other tests
    matrices: list[PlatformMatrix]
    skip_reasons: list[tuple[str, int]]
    histograms: dict[str, Path]
    results: list[CaseResult] = field(default_factory=list)

    @property
    def n_failed(self) -> int:
        return self.totals["failed"] + self.totals["error"]

    @property
    def n_ran(self) -> int:
        return self.totals["passed"] + self.n_failed

    @classmethod
    def build(cls, results: list[CaseResult], meta: dict, dispatch: str,
              histograms: dict[str, Path] | None = None) -> ReportModel:
        counts: dict[tuple[str, str], Counter] = defaultdict(Counter)
        worst: dict[tuple[str, str], float] = {}
        by_platform: dict[str, dict] = {}
        for r in results:
            k = (r.platform, r.backend)
            counts[k][r.outcome] += 1
            if r.worst_ulps is not None:
                worst[k] = max(worst.get(k, 0.0), r.worst_ulps)
            by_platform.setdefault(r.platform, {}).setdefault((r.scheme, r.activation), {})[r.backend] = r
        summary = [SummaryRow(p, b, c["passed"], c["failed"] + c["error"], c["skipped"], worst.get((p, b)))
                   for (p, b), c in sorted(counts.items())]
        failures = [(f"{r.scheme}/{r.activation}/{r.backend}/{r.platform}", r.reason)
                    for r in results if r.outcome in ("failed", "error")]
        failures += [(f["nodeid"], f["message"]) for f in meta.get("other_failures", [])]
        matrices = []
        for platform, rows in sorted(by_platform.items()):
            ran = {k: v for k, v in rows.items() if any(x.outcome != "skipped" for x in v.values())}
            backends = sorted({b for v in ran.values() for b, x in v.items() if x.outcome != "skipped"})
            if backends:
                matrices.append(PlatformMatrix(platform, backends, sorted(ran.items())))
        return cls(meta, dispatch, Counter(r.outcome for r in results), summary, failures, matrices,
                   Counter(r.reason for r in results if r.outcome == "skipped").most_common(), histograms or {},
                   results)


_HOST_FIELDS = ("platform", "device", "torch", "triton", "python", "commit", "date", "command")
_ULPS_NOTE = ("Worst error: the largest |kernel - reference| in bf16 ulps of the reference value, over the outputs "
              "at least 2^-8 of the case's largest (near-zero outputs are judged by the bound alone); in brackets, "
              "the largest error as a fraction of the derived bound, over every output (a case passes at <= 1).")
_SUMMARY_HEAD = ("platform", "backend", "passed", "failed", "skipped", "worst ulps")


def false_alarm_note(model: ReportModel) -> str:
    """The probabilistic part of the bounds, stated: per case and for the whole run (a union bound)."""
    p = [r.false_alarm for r in model.results if r.outcome != "skipped"]
    return ("False alarms: the bound's GEMM terms are probabilistic (harness.core.tolerances: Higham and Mary's and "
            "Azuma's bounds on round-to-nearest errors, each GEMM output failing with probability at most 2^-50). "
            f"The probability that a correct kernel fails a case is at most {max(p, default=0.0):.2g} (the largest "
            f"case); at most {min(1.0, sum(p)):.2g} that it fails any of this run's {len(p)} cases.")


def _summary_cells(row: SummaryRow) -> tuple:
    return row.platform, row.backend, row.passed, row.failed, row.skipped, row.worst_text


_SHAPE_HEAD = ("backend", "passed", "failed", "declined", "why declined (most frequent)")


def shape_class_rows(tally: dict) -> list[tuple]:
    """One row per backend of the shape-class tallies (harness.outputs.pytest_plugin): how many (class, scheme)
    pairs passed, failed and were declined, and the most frequent reason for declining - so that a backend
    declining every K tail is visible, never silent."""
    rows = []
    for backend in sorted(tally):
        t = tally[backend]
        reasons = sorted(t.get("reasons", {}).items(), key=lambda kv: -kv[1])[:2]
        why = "; ".join(f"{n}x {r[:160]}" for r, n in reasons)
        rows.append((backend, t.get("passed", 0), t.get("failed", 0), t.get("declined", 0), why))
    return rows


def render_markdown(model: ReportModel, out_dir: Path) -> str:
    m, t = model.meta, model.totals
    host = {k: m.get(k) for k in _HOST_FIELDS}
    lines = [
        "# moe-conformance report", "",
        "Host: **{platform}** ({device}), torch {torch}, triton {triton}, python {python}; commit {commit}; "
        "{date}.".format(**host), "",
        f"Command: `{host['command']}`", "",
        f"Conformance cases: **{t['passed']} passed, {model.n_failed} failed, {t['skipped']} skipped** "
        f"({model.n_ran} ran). Other tests: {m.get('other_tests', '')}.", "",
        _ULPS_NOTE, "", false_alarm_note(model), "",
        "## Per platform and backend", "",
        "| " + " | ".join(_SUMMARY_HEAD) + " |", "|---" * len(_SUMMARY_HEAD) + "|",
    ]
    lines += ["| " + " | ".join(str(c) for c in _summary_cells(row)) + " |" for row in model.summary]
    lines += ["", "## Failures", ""]
    lines += [f"- `{what}`: {msg.splitlines()[0] if msg else ''}" for what, msg in model.failures] or ["None."]
    for mat in model.matrices:
        lines += ["", f"## Cases on {mat.platform}", "", "| scheme | activation | " + " | ".join(mat.backends) + " |",
                  "|---|---|" + "---|" * len(mat.backends)]
        for (scheme, act), by_b in mat.rows:
            lines.append(f"| {scheme} | {act} | " + " | ".join(_cell_text(by_b.get(b)) for b in mat.backends) + " |")
    shape_rows = shape_class_rows(m.get("shape_classes", {}))
    if shape_rows:
        lines += ["", "## Shape classes per backend (test_shape_class)", "",
                  "| " + " | ".join(_SHAPE_HEAD) + " |", "|---" * len(_SHAPE_HEAD) + "|"]
        lines += ["| " + " | ".join(str(c).replace("|", "/") for c in row) + " |" for row in shape_rows]
    lines += ["", "## Skip reasons", "", "| cases | reason |", "|---|---|"]
    lines += [f"| {n} | {reason.replace('|', '/')} |" for reason, n in model.skip_reasons]
    if model.histograms:
        lines += ["", "## Error histograms", ""]
        lines += [f"![{s}]({p.relative_to(out_dir).as_posix()})" for s, p in model.histograms.items()]
    lines += ["", "## Dispatch table (the oracle: which backend each platform picks)", "", "```",
              model.dispatch.rstrip(), "```", ""]
    return "\n".join(lines)


_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#1b1b1b;background:#fff}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 6px;font-size:12px}
th{background:#f3f3f3;position:sticky;top:0}
td.passed{background:#dff3e0}td.failed,td.error{background:#f8d4d4;font-weight:bold}td.skipped{background:#f4f4f4;color:#888}
.totals span{display:inline-block;margin-right:1em;padding:.2em .6em;border-radius:4px}
.ok{background:#dff3e0}.bad{background:#f8d4d4}.skip{background:#eee}
pre{background:#f7f7f7;padding:.6em;overflow:auto;max-height:30em;font-size:11px}
img{max-width:100%;border:1px solid #ddd;margin:.3em 0}
"""


class _Markup(str):
    """A cell already rendered (with its class or title): _html_row leaves it as it is."""


def _html_row(cells, tag="td") -> str:
    return "<tr>" + "".join(c if isinstance(c, _Markup) else f"<{tag}>{html.escape(str(c))}</{tag}>"
                            for c in cells) + "</tr>"


def render_html(model: ReportModel) -> str:
    e = html.escape
    m, t = model.meta, model.totals
    host = {k: e(str(m.get(k))) for k in _HOST_FIELDS}
    n_fail = model.n_failed
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>moe-conformance report</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>moe-conformance report</h1>",
        "<p>Host: <b>{platform}</b> ({device}), torch {torch}, triton {triton}, python {python}; commit {commit}; "
        "{date}<br>Command: <code>{command}</code></p>".format(**host),
        f"<p class='totals' id='totals' data-passed='{t['passed']}' data-failed='{n_fail}' data-skipped='{t['skipped']}'>"
        f"<span class='ok'>{t['passed']} passed</span><span class='{'bad' if n_fail else 'ok'}'>{n_fail} failed</span>"
        f"<span class='skip'>{t['skipped']} skipped</span> conformance cases. Other tests: {e(str(m.get('other_tests', '')))}</p>",
        f"<p>{e(_ULPS_NOTE)} Hover a cell for the full reason.</p>", f"<p>{e(false_alarm_note(model))}</p>",
        "<h2>Per platform and backend</h2><table id='summary'>" + _html_row(_SUMMARY_HEAD, "th"),
    ]
    for row in model.summary:
        cls = "failed" if row.failed else ("passed" if row.passed else "skipped")
        cells = list(_summary_cells(row))
        cells[3] = _Markup(f"<td class='{cls}'>{row.failed}</td>")
        parts.append(_html_row(cells))
    parts.append("</table><h2>Failures</h2>")
    if not model.failures:
        parts.append("<p>None.</p>")
    else:
        parts.append("<ul id='failures'>" + "".join(f"<li><code>{e(what)}</code>: {e(msg)}</li>"
                                                    for what, msg in model.failures) + "</ul>")
    for mat in model.matrices:
        parts.append(f"<h2>Cases on {e(mat.platform)}</h2><table class='matrix' data-platform='{e(mat.platform)}'>"
                     + _html_row(["scheme", "activation", *mat.backends], "th"))
        for (scheme, act), by_b in mat.rows:
            cells = [scheme, act]
            for b in mat.backends:
                r = by_b.get(b)
                cells.append("" if r is None else _Markup(
                    f"<td class='{r.outcome}' title='{e(r.reason)}'>{e(_cell_text(r).replace('**', ''))}</td>"))
            parts.append(_html_row(cells))
        parts.append("</table>")
    shape_rows = shape_class_rows(m.get("shape_classes", {}))
    if shape_rows:
        parts.append("<h2>Shape classes per backend</h2><table id='shape-classes'>" + _html_row(list(_SHAPE_HEAD), "th"))
        parts += [_html_row(list(row)) for row in shape_rows]
        parts.append("</table>")
    parts.append("<h2>Skip reasons</h2><table>" + _html_row(["cases", "reason"], "th"))
    parts += [_html_row([n, reason]) for reason, n in model.skip_reasons]
    parts.append("</table>")
    if model.histograms:
        parts.append("<h2>Error histograms</h2>")
        for scheme, path in model.histograms.items():
            data = base64.b64encode(path.read_bytes()).decode()
            parts.append(f"<div><img class='histogram' alt='{e(scheme)} error histogram' src='data:image/png;base64,{data}'></div>")
    parts.append(f"<h2>Dispatch table</h2><pre id='dispatch'>{e(model.dispatch)}</pre>")
    # the browser test reads this: how many images actually decoded
    parts.append("<script>window.addEventListener('load',()=>{const i=[...document.images];"
                 "document.body.dataset.imagesDecoded=i.filter(x=>x.complete&&x.naturalWidth>0).length;"
                 "document.body.dataset.images=i.length;});</script>")
    parts.append("</body></html>")
    return "\n".join(parts)


def render_terminal(model: ReportModel) -> list[str]:
    """The summary pytest prints at the end: platform x backend pairs that ran a case."""
    lines = [f"{'platform':<8} {'backend':<34} {'passed':>6} {'failed':>6} {'skipped':>7} {'worst ulps':>10}"]
    lines += [f"{r.platform:<8} {r.backend:<34} {r.passed:>6} {r.failed:>6} {r.skipped:>7} {r.worst_text:>10}"
              for r in model.summary if r.ran]
    skipped_only = sum(1 for r in model.summary if not r.ran)
    if skipped_only:
        lines.append(f"({skipped_only} platform x backend pairs only skipped: reasons in the report)")
    return lines


def write_report(results: list[CaseResult], out_dir: Path | str, meta: dict, dispatch: str) -> dict[str, Path]:
    """Write results.json, summary.md, histograms/*.png and index.html into out_dir; return their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = sorted(results, key=lambda r: r.key)
    histograms = write_histograms(results, out_dir / "histograms")
    paths = {"json": out_dir / "results.json", "markdown": out_dir / "summary.md", "html": out_dir / "index.html"}
    payload = dict(meta=meta, dispatch=dispatch, histogram_bins=_histogram_bins(),
                   cases=[asdict(r) for r in results])
    paths["json"].write_text(json.dumps(payload, indent=1, default=str))
    model = ReportModel.build(results, meta, dispatch, histograms)
    paths["markdown"].write_text(render_markdown(model, out_dir))
    paths["html"].write_text(render_html(model))
    return {**paths, **{f"histogram:{s}": p for s, p in histograms.items()}}


def load_results(path: Path | str) -> tuple[list[CaseResult], dict, str]:
    """Read a results.json back (to re-render, or to compare runs)."""
    payload = json.loads(Path(path).read_text())
    return [CaseResult(**c) for c in payload["cases"]], payload["meta"], payload["dispatch"]
