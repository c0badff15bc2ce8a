"""Real model shapes on a GPU host (issue 24): every backend that runs on the GPU, at each model's layer and TP
share (harness.inputs.model_shapes), at 1, 8 and 64 tokens, all experts' weights allocated, against the float64
reference computed on the GPU (harness.core.real_shapes). One test per (share, scheme): the checkpoint is built
once and each reference serves every backend of its structure. Under the ci profile each share runs bf16 and its
model's released checkpoint schemes; dev and nightly run every scheme. On a CPU host the same properties run at
interpreter cost as shape classes (suites/test_conformance.py::test_shape_class)."""

from __future__ import annotations

import json

import pytest

from harness.core.real_shapes import gpu_case_slot, model_share_cases, run_model_share, share_bytes
from harness.platforms import default_device, detect_platform


def test_model_shape(model_share, backends, record_property):
    share, scheme = model_share
    host = detect_platform()
    if not host.is_gpu:
        pytest.skip("real model shapes run on a GPU host (every expert allocated, the float64 reference on the GPU); "
                    "on this CPU the same properties run as shape classes (test_shape_class)")
    device = default_device()
    with gpu_case_slot(device, share_bytes(share, scheme)):
        runs = run_model_share(backends, share, scheme, host, device,
                               progress=lambda r: print(r.line(), flush=True))
    judged = [r for r in runs if r.result is not None]
    record_property("model_shape_runs", json.dumps([dict(case=r.case, backend=r.backend, skipped=r.skipped,
                                                         ok=None if r.result is None else r.result.ok,
                                                         max_ratio=None if r.result is None else r.result.max_ratio)
                                                    for r in runs]))
    if not judged:
        pytest.skip(f"{share}/{scheme}: no GPU backend runs it here: "
                    + "; ".join(sorted({f'{r.backend}: {r.skipped}' for r in runs}))[:2000])
    wrong = [r for r in judged if not r.result.ok and not r.known_failure]
    passing_known = [r for r in judged if r.result.ok and r.known_failure]
    assert not wrong, "\n\n".join(r.result.message() for r in wrong)
    assert not passing_known, "\n".join(
        f"{r.what} passes, declared a known failure ({r.known_failure.reason}): the upstream fix has landed "
        f"({r.known_failure.upstream}) or this shape no longer catches it ({r.result.max_ratio:.2f} of the bound)"
        for r in passing_known)
    known = [r for r in judged if r.known_failure]
    if known:
        pytest.xfail("; ".join(f"{r.what}: known failure of {r.backend} ({r.known_failure.reason})" for r in known))


# ---- the runner itself, on any host (a real share at one token: seconds on the CPU) --------------------------------

def test_runner_passes_a_correct_backend_and_fails_the_bias_bug_at_a_real_share():
    """gpt-oss-20b at TP 8 (32 experts, H 2880, I 360, top-4), biased per-tensor FP8, one reference for both: the
    catalog's correct control passes, vLLM's FP8 bias-before-dequantization bug fails most elements."""
    from harness.detection.catalog import make_mutant
    from harness.platforms import PLATFORMS

    backends = {"control": make_mutant("control"), "bias_bug": make_mutant("fp8_bias_before_dequantization")}
    runs = {r.backend: r for r in run_model_share(backends, "gpt-oss-20b/tp8", "w_fp8_a_fp8", PLATFORMS["cpu"], "cpu",
                                                  tokens=(1,), gpu_only=False)}
    assert runs["control"].result.ok, runs["control"].result.message()
    bug = runs["bias_bug"].result
    assert not bug.ok and bug.n_bad > bug.n_total / 2, (bug.n_bad, bug.n_total)
    assert runs["bias_bug"].line().startswith("FAILED   gpt-oss-20b/tp8/T1/w_fp8_a_fp8/bias_bug:")


def test_runner_says_why_a_case_does_not_run(monkeypatch):
    from harness.detection.catalog import make_mutant
    from harness.platforms import PLATFORMS

    control = {"control": make_mutant("control")}
    cpu = PLATFORMS["cpu"]
    (run,) = run_model_share(control, "gpt-oss-20b/tp8", "bf16", cpu, "cpu", tokens=(1,))
    assert run.result is None and "runs on the host CPU" in run.skipped
    monkeypatch.setenv("MOE_CONFORMANCE_CASE_GB", "0.5")
    (run,) = run_model_share(control, "kimi-k2", "bf16", cpu, "cpu", tokens=(64,), gpu_only=False)
    assert run.result is None and "float64 reference of 384 routed experts" in run.skipped and "> the 0.5 GB a case" in run.skipped
    (run,) = run_model_share(control, "gpt-oss-20b/tp8", "w_mxfp4", cpu, "cpu", tokens=(1,), gpu_only=False)
    assert run.result is None and "intermediate_size=360 must be a positive multiple of 32" in run.skipped


def test_ci_cases_cover_every_model_share_and_each_released_scheme():
    from harness.inputs.model_shapes import MODEL_LAYERS

    ci = model_share_cases("ci")
    assert {s for s, _ in ci} == {layer.name(tp) for layer in MODEL_LAYERS.values() for tp in layer.tp}
    assert {("gpt-oss-120b/tp2", "w_mxfp4"), ("kimi-k2/tp8", "w_fp8_a_fp8_block"), ("mixtral-8x7b", "w_fp8_a_fp8"),
            ("deepseek-v3/tp8", "w_nvfp4_a_nvfp4")} <= set(ci)
    assert len(model_share_cases("nightly")) > len(ci)


def test_gpu_case_slots_are_held_across_processes_and_released():
    """The slots are file locks that other pytest-xdist workers (processes) see; released on exit, also on error."""
    import os
    import subprocess
    import sys
    import tempfile

    slot = os.path.join(tempfile.gettempdir(), f"moe-conformance-gpu-slots-{os.getuid()}", "slot-0")
    probe = [sys.executable, "-c", "import fcntl, sys; f = open(sys.argv[1], 'w')\n"
             "try: fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\nexcept BlockingIOError: sys.exit(3)", slot]
    with gpu_case_slot("cpu", 1) as taken:  # no GPU: one slot
        assert taken == 1 and subprocess.run(probe).returncode == 3
    assert subprocess.run(probe).returncode == 0
    with pytest.raises(RuntimeError), gpu_case_slot("cpu", 1):
        raise RuntimeError("a failing test")
    assert subprocess.run(probe).returncode == 0
