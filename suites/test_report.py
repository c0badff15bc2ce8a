"""The conformance report: `pytest --report DIR` records what ran and how it ended, a wrong backend shows
up as failed with its numbers, and the HTML page renders in a real headless browser (Debian's Chromium;
`make test` installs it and requires it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.outputs.report import CaseResult, load_results, write_report
from harness.platforms import detect_platform

ROOT = Path(__file__).resolve().parent.parent
HOST = detect_platform().name  # the subprocess selects this machine's own cases (on a GPU host: its platform's)
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars"]


def _histogram(exact: int, near: int, over: int = 0) -> list[int]:
    h = [0] * 22
    h[0], h[15], h[18] = exact, near, over  # exact, 2^-3 x bound, 2^0 (over the bound)
    return h


SAMPLE = [
    CaseResult("cpu", "w_mxfp4", "SILU", "good", "passed", worst_ulps=1.0, max_ratio=0.25, n_total=1024,
               ratio_histogram=_histogram(1000, 24), false_alarm=2.0**-30),
    CaseResult("cpu", "w_mxfp4", "SILU", "bad", "failed", reason="w_mxfp4/SILU/bad/cpu: output: 3 of 1024 elements out of bound",
               worst_ulps=13.0, max_ratio=4.5, n_bad=3, n_total=1024, ratio_histogram=_histogram(990, 31, 3)),
    CaseResult("cpu", "w_fp8_a_fp8", "GELU", "good", "skipped", reason="good: cpu has no FP8 matrix units"),
    CaseResult("sm90", "w_mxfp4", "SILU", "good", "skipped", reason="good on this cpu machine: needs a GPU"),
]
META = dict(platform="cpu", device="cpu", torch="x", triton="y", python="3", commit="abc", date="today",
            command="pytest --report", other_tests="5 passed", other_failures=[])


def test_report_files_hold_every_case_and_round_trip(tmp_path):
    paths = write_report(SAMPLE, tmp_path, META, "cpu w_mxfp4 SILU -> good\n")
    results, meta, dispatch = load_results(paths["json"])
    assert sorted(r.key for r in results) == sorted(r.key for r in SAMPLE) and meta == META
    assert "-> good" in dispatch
    md = paths["markdown"].read_text()
    assert "| cpu | bad | 0 | 1 | 0 | 13 |" in md and "| cpu | good | 1 | 0 | 1 | 1 |" in md
    assert "**FAILED** 13 ulp" in md and "pass 1 ulp (0.25)" in md
    assert "good: cpu has no FP8 matrix units" in md  # the skip reason, counted
    # the probabilistic bound's false-alarm probability, per case (the largest) and for the run (the sum)
    assert "a correct kernel fails a case is at most 9.3e-10" in md and "any of this run's 2 cases" in md
    assert (tmp_path / "histograms" / "w_mxfp4.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = paths["html"].read_text()
    assert "data:image/png;base64," in page and "src='histograms/" not in page  # self-contained


def test_pytest_report_option_records_a_wrong_backend_as_failed(tmp_path):
    out = tmp_path / "report"
    cmd = [sys.executable, "-m", "pytest", "suites/test_conformance.py", "-q", "-p", "no:cacheprovider",
           "-p", "no:randomly", "--hypothesis-profile=ci", f"--report={out}", f"--junitxml={out}/junit.xml",
           "--backend", "torch_emulation", "--backend", "examples.wrong_backend:make_backend",
           "-k", f"test_conformance[ and w_mxfp4_a_mxfp4/SILU/ and {HOST}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the wrong backend fails
    assert "conformance summary" in proc.stdout
    cases = {(c["backend"], c["platform"]): c for c in json.loads((out / "results.json").read_text())["cases"]}
    good, bad = cases[("torch_emulation", HOST)], cases[("wrong_example", HOST)]
    assert good["outcome"] == "passed" and good["max_ratio"] <= 1 and sum(good["ratio_histogram"]) == good["n_total"]
    assert 0 < good["false_alarm"] < 2.0**-30  # the bound's stated false-alarm probability crosses xdist
    assert bad["outcome"] == "failed" and bad["max_ratio"] > 1 and bad["n_bad"] > 0
    assert "out of bound" in bad["reason"] and "wrong_example" in bad["reason"]
    assert (out / "junit.xml").exists() and (out / "histograms" / "w_mxfp4_a_mxfp4.png").exists()


def test_the_report_tallies_shape_classes_and_what_each_backend_declines(tmp_path):
    """A backend that declines K tails must be visible in the report, never silent (issue 24)."""
    out = tmp_path / "report"
    cmd = [sys.executable, "-m", "pytest", "suites/test_conformance.py", "-q", "-p", "no:cacheprovider",
           "--hypothesis-profile=dev", f"--report={out}", "--backend", "torch_emulation",
           "-k", "test_shape_class and k_tails_gpt-oss-120b_tp8"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tally = json.loads((out / "results.json").read_text())["meta"]["shape_classes"]["torch_emulation"]
    # I = 232 at TP 8: bf16 and per-tensor FP8 run; MX (32), NVFP4 (16) and block FP8 (128) blocks do not divide it
    assert tally["passed"] == 2 and tally["failed"] == 0 and tally["declined"] == 3, tally
    summary = (out / "summary.md").read_text()
    assert "## Shape classes per backend" in summary and "| torch_emulation | 2 | 0 | 3 |" in summary
    assert "shape-classes" in (out / "index.html").read_text()


def _needs_chromium():
    if CHROMIUM:
        return
    if os.environ.get("MOE_CONFORMANCE_REQUIRE_BROWSER"):
        pytest.fail("Chromium is required here (make test installs Debian's chromium package) but is not on PATH")
    pytest.skip("no Chromium on this machine (Debian package chromium; make test installs it)")


def _chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=120)


def test_html_report_renders_in_headless_chromium(tmp_path):
    _needs_chromium()
    paths = write_report(SAMPLE, tmp_path / "report", META, "cpu w_mxfp4 SILU -> good\n")
    url = paths["html"].resolve().as_uri()
    dom = _chromium(["--virtual-time-budget=3000", "--dump-dom", url], tmp_path / "profile1")
    assert "<table id=\"summary\"" in dom.stdout, dom.stderr[-2000:]
    # every embedded histogram decoded in the browser (set by the page's own load handler)
    assert 'data-images="1"' in dom.stdout and 'data-images-decoded="1"' in dom.stdout, dom.stdout[-1500:]
    shot = tmp_path / "shot.png"
    _chromium([f"--screenshot={shot}", "--window-size=1200,900", url], tmp_path / "profile2")
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)[..., :3]
    assert pixels.shape[:2] == (900, 1200)
    colours = {tuple(round(float(c) * 255) for c in px) for px in pixels.reshape(-1, 3)[::7]}
    assert (0xF8, 0xD4, 0xD4) in colours, "the failed case's red cell is not on the screen"
    assert (0xDF, 0xF3, 0xE0) in colours, "the passed case's green cell is not on the screen"


def test_the_chain_timeline_cuts_replays_at_the_flushes_and_reports_gaps():
    """tools/chain_timeline.py on a synthetic profiler trace: two replays of three kernels after 256 MB flushes (a
    fill kernel, then a memset), a small fill of the forward's own kept in its replay, a GEMM longer than the flush
    whose name holds "fill" (bf16_prefill_kernel) kept too; the gaps between kernels (negative where programmatic
    dependents overlap) and each replay's wall and summed kernel time."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    from chain_timeline import replay_kernels, timeline

    def k(name, ts, dur, cat="kernel"):
        return dict(ph="X", cat=cat, name=name, ts=ts, dur=dur)

    trace = [k("vectorized_elementwise_kernel<FillFunctor>", 0, 80), k("align", 100, 2), k("gemm1", 101, 20),
             k("small FillFunctor", 121, 1), k("gemm2", 125, 10), dict(ph="i", name="marker", ts=130),
             k("Memset (Device)", 200, 70, cat="gpu_memset"), k("align", 300, 2), k("gemm1", 303, 20),
             k("small FillFunctor", 323, 1), k("gemm2", 330, 10)]
    runs = replay_kernels(list(reversed(trace)))
    assert [[n for n, *_ in r] for r in runs] == [["align", "gemm1", "small FillFunctor", "gemm2"]] * 2
    prefill = [k("vectorized_elementwise_kernel<FillFunctor>", 0, 80), k("align", 100, 2),
               k("bf16_prefill_kernel", 103, 2000), k("topk_reduce", 2104, 100)]
    assert [[n for n, *_ in r] for r in replay_kernels(prefill)] == [["align", "bf16_prefill_kernel", "topk_reduce"]]
    lines, wall, busy = timeline(runs[0])
    assert (wall, busy) == (35.0, 33.0)
    assert [line.split()[2] for line in lines[1:]] == ["-1.0", "+0.0", "+3.0"]
    lines, wall, busy = timeline(runs[1])
    assert (wall, busy) == (40.0, 33.0) and lines[1].split()[2] == "+1.0"
    with pytest.raises(RuntimeError, match="no L2 flush"):
        replay_kernels([k("gemm1", 0, 5)])

