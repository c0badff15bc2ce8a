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

__all__ = ["CaseResult", "case_properties", "case_identity", "write_report", "load_results", "OUTCOMES",
           "CASE_PROPERTY", "CASE_IDENTITY", "platform_backend_counts", "platform_backend_worst"]

OUTCOMES = ("passed", "failed", "error", "skipped")
CASE_PROPERTY = "moe_case"  # the user_properties key the conformance test records its result under
CASE_IDENTITY = "moe_case_identity"  # ... and the key its identity is recorded under at collection


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
                           ratio_histogram=list(comparison.ratio_histogram)))


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


def platform_backend_counts(results: list[CaseResult]) -> dict[tuple[str, str], Counter]:
    counts: dict[tuple[str, str], Counter] = defaultdict(Counter)
    for r in results:
        counts[(r.platform, r.backend)][r.outcome] += 1
    return counts


def platform_backend_worst(results: list[CaseResult]) -> dict[tuple[str, str], float]:
    worst: dict[tuple[str, str], float] = {}
    for r in results:
        if r.worst_ulps is not None:
            k = (r.platform, r.backend)
            worst[k] = max(worst.get(k, 0.0), r.worst_ulps)
    return worst


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


def _summary_rows(results: list[CaseResult]):
    counts, worst = platform_backend_counts(results), platform_backend_worst(results)
    for (platform, backend), c in sorted(counts.items()):
        w = worst.get((platform, backend))
        yield platform, backend, c["passed"], c["failed"] + c["error"], c["skipped"], "" if w is None else f"{w:.3g}"


def _skip_reasons(results: list[CaseResult]) -> list[tuple[str, int]]:
    return Counter(r.reason for r in results if r.outcome == "skipped").most_common()


def _matrix(results: list[CaseResult]):
    """platform -> (backends, rows of (scheme, activation, {backend: result})) over cases that ran."""
    by_platform: dict[str, dict] = {}
    for r in results:
        by_platform.setdefault(r.platform, {}).setdefault((r.scheme, r.activation), {})[r.backend] = r
    for platform, rows in sorted(by_platform.items()):
        ran = {k: v for k, v in rows.items() if any(x.outcome != "skipped" for x in v.values())}
        backends = sorted({b for v in ran.values() for b, x in v.items() if x.outcome != "skipped"})
        yield platform, backends, sorted(ran.items())


def render_markdown(results: list[CaseResult], meta: dict, dispatch: str, histograms: dict[str, Path],
                    out_dir: Path) -> str:
    ran = _ran(results)
    c = Counter(r.outcome for r in results)
    lines = [
        "# moe-conformance report", "",
        f"Host: **{meta.get('platform')}** ({meta.get('device')}), torch {meta.get('torch')}, triton "
        f"{meta.get('triton')}, python {meta.get('python')}; commit {meta.get('commit')}; {meta.get('date')}.", "",
        f"Command: `{meta.get('command')}`", "",
        f"Conformance cases: **{c['passed']} passed, {c['failed'] + c['error']} failed, {c['skipped']} skipped** "
        f"({len(ran)} ran). Other tests: {meta.get('other_tests', '')}.", "",
        "Worst error: the largest |kernel - reference| in bf16 ulps of the reference value, over the outputs "
        "at least 2^-8 of the case's largest (near-zero outputs are judged by the bound alone); in brackets, the "
        "largest error as a fraction of the derived bound, over every output (pass <= 1).", "",
        "## Per platform and backend", "",
        "| platform | backend | passed | failed | skipped | worst ulps |", "|---|---|---|---|---|---|",
    ]
    lines += [f"| {p} | {b} | {n_pass} | {n_fail} | {n_skip} | {w} |" for p, b, n_pass, n_fail, n_skip, w in _summary_rows(results)]
    failures = [r for r in results if r.outcome in ("failed", "error")]
    other = meta.get("other_failures", [])
    lines += ["", "## Failures", ""]
    if not failures and not other:
        lines.append("None.")
    for r in failures:
        lines.append(f"- `{r.scheme}/{r.activation}/{r.backend}/{r.platform}`: {r.reason.splitlines()[0] if r.reason else ''}")
    for f in other:
        lines.append(f"- `{f['nodeid']}`: {f['message']}")
    for platform, backends, rows in _matrix(results):
        if not backends:
            continue
        lines += ["", f"## Cases on {platform}", "", "| scheme | activation | " + " | ".join(backends) + " |",
                  "|---|---|" + "---|" * len(backends)]
        for (scheme, act), by_b in rows:
            lines.append(f"| {scheme} | {act} | " + " | ".join(_cell_text(by_b.get(b)) for b in backends) + " |")
    lines += ["", "## Skip reasons", "", "| cases | reason |", "|---|---|"]
    lines += [f"| {n} | {reason.replace('|', '/')} |" for reason, n in _skip_reasons(results)]
    if histograms:
        lines += ["", "## Error histograms", ""]
        lines += [f"![{s}]({p.relative_to(out_dir).as_posix()})" for s, p in histograms.items()]
    lines += ["", "## Dispatch table (the oracle: which backend each platform picks)", "", "```", dispatch.rstrip(), "```", ""]
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


def render_html(results: list[CaseResult], meta: dict, dispatch: str, histograms: dict[str, Path]) -> str:
    e = html.escape
    c = Counter(r.outcome for r in results)
    n_fail = c["failed"] + c["error"]
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>moe-conformance report</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>moe-conformance report</h1>",
        f"<p>Host: <b>{e(str(meta.get('platform')))}</b> ({e(str(meta.get('device')))}), torch {e(str(meta.get('torch')))}, "
        f"triton {e(str(meta.get('triton')))}, python {e(str(meta.get('python')))}; commit {e(str(meta.get('commit')))}; "
        f"{e(str(meta.get('date')))}<br>Command: <code>{e(str(meta.get('command')))}</code></p>",
        f"<p class='totals' id='totals' data-passed='{c['passed']}' data-failed='{n_fail}' data-skipped='{c['skipped']}'>"
        f"<span class='ok'>{c['passed']} passed</span><span class='{'bad' if n_fail else 'ok'}'>{n_fail} failed</span>"
        f"<span class='skip'>{c['skipped']} skipped</span> conformance cases. Other tests: {e(str(meta.get('other_tests', '')))}</p>",
        "<p>Worst error: the largest |kernel - reference| in bf16 ulps of the reference value, over the outputs "
        "at least 2^-8 of the case's largest (near-zero outputs are judged by the bound alone); in brackets the "
        "largest error as a fraction of the derived bound, over every output (a case passes at &le; 1). Hover a "
        "cell for the full reason.</p>",
        "<h2>Per platform and backend</h2><table id='summary'><tr><th>platform</th><th>backend</th><th>passed</th>"
        "<th>failed</th><th>skipped</th><th>worst ulps</th></tr>",
    ]
    for p, b, n_pass, n_f, n_skip, w in _summary_rows(results):
        cls = "failed" if n_f else ("passed" if n_pass else "skipped")
        parts.append(f"<tr><td>{e(p)}</td><td>{e(b)}</td><td>{n_pass}</td><td class='{cls}'>{n_f}</td>"
                     f"<td>{n_skip}</td><td>{e(w)}</td></tr>")
    parts.append("</table><h2>Failures</h2>")
    failures = [r for r in results if r.outcome in ("failed", "error")]
    other = meta.get("other_failures", [])
    if not failures and not other:
        parts.append("<p>None.</p>")
    else:
        parts.append("<ul id='failures'>")
        parts += [f"<li><code>{e(r.scheme)}/{e(r.activation)}/{e(r.backend)}/{e(r.platform)}</code>: {e(r.reason)}</li>" for r in failures]
        parts += [f"<li><code>{e(f['nodeid'])}</code>: {e(f['message'])}</li>" for f in other]
        parts.append("</ul>")
    for platform, backends, rows in _matrix(results):
        if not backends:
            continue
        parts.append(f"<h2>Cases on {e(platform)}</h2><table class='matrix' data-platform='{e(platform)}'><tr>"
                     "<th>scheme</th><th>activation</th>" + "".join(f"<th>{e(b)}</th>" for b in backends) + "</tr>")
        for (scheme, act), by_b in rows:
            cells = []
            for b in backends:
                r = by_b.get(b)
                if r is None:
                    cells.append("<td></td>")
                    continue
                text = _cell_text(r).replace("**", "")
                cells.append(f"<td class='{r.outcome}' title='{e(r.reason)}'>{e(text)}</td>")
            parts.append(f"<tr><td>{e(scheme)}</td><td>{e(act)}</td>{''.join(cells)}</tr>")
        parts.append("</table>")
    parts.append("<h2>Skip reasons</h2><table><tr><th>cases</th><th>reason</th></tr>")
    parts += [f"<tr><td>{n}</td><td>{e(reason)}</td></tr>" for reason, n in _skip_reasons(results)]
    parts.append("</table>")
    if histograms:
        parts.append("<h2>Error histograms</h2>")
        for scheme, path in histograms.items():
            data = base64.b64encode(path.read_bytes()).decode()
            parts.append(f"<div><img class='histogram' alt='{e(scheme)} error histogram' src='data:image/png;base64,{data}'></div>")
    parts.append(f"<h2>Dispatch table</h2><pre id='dispatch'>{e(dispatch)}</pre>")
    # the browser test reads this: how many images actually decoded
    parts.append("<script>window.addEventListener('load',()=>{const i=[...document.images];"
                 "document.body.dataset.imagesDecoded=i.filter(x=>x.complete&&x.naturalWidth>0).length;"
                 "document.body.dataset.images=i.length;});</script>")
    parts.append("</body></html>")
    return "\n".join(parts)


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
    paths["markdown"].write_text(render_markdown(results, meta, dispatch, histograms, out_dir))
    paths["html"].write_text(render_html(results, meta, dispatch, histograms))
    return {**paths, **{f"histogram:{s}": p for s, p in histograms.items()}}


def load_results(path: Path | str) -> tuple[list[CaseResult], dict, str]:
    """Read a results.json back (to re-render, or to compare runs)."""
    payload = json.loads(Path(path).read_text())
    return [CaseResult(**c) for c in payload["cases"]], payload["meta"], payload["dispatch"]
