"""Project-wide pytest configuration: Hypothesis profiles, platform markers, backend selection.

Profiles (pick with --hypothesis-profile NAME; `make test` uses ci):
  dev      quick local runs, random, database in .hypothesis/
  ci       derandomized and bounded so that `make test` fits CI's budget; no database writes
  nightly  many examples, target() on the normalised error, database written (.hypothesis/examples; the
           nightly workflow keeps it per platform as an artifact, and MOE_CONFORMANCE_SHARED_DB=owner/repo
           multiplexes those artifacts read-only into local dev runs)
Backends: every registered one (built-ins and the `moe_conformance.backends` entry points), or only
those named with --backend NAME|module:factory (repeatable).
Markers: a test of platform-independent truths (the reference) holds on every platform and carries
all platform markers; a conformance case carries its platform's. `pytest -m gfx942` selects both.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

from harness.outputs.matrix import shared_database
from harness.platforms import PLATFORMS

# nightly writes here; the nightly workflow restores the previous night's copy before the run and
# uploads it after (per platform)
_DB = DirectoryBasedExampleDatabase(os.environ.get("MOE_CONFORMANCE_HYPOTHESIS_DB", ".hypothesis/examples"))
_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large]

try:
    _DEV_DB = shared_database(_DB)
except ValueError as exc:  # a bad MOE_CONFORMANCE_SHARED_DB: one line, not a traceback
    raise pytest.UsageError(str(exc)) from None
settings.register_profile("dev", max_examples=50, deadline=None, database=_DEV_DB,
                          suppress_health_check=_SLOW_OK)
settings.register_profile(
    "ci", max_examples=60, deadline=None, derandomize=True, database=None, print_blob=True,
    suppress_health_check=_SLOW_OK,
)
# nightly: 500 examples per property. At 2000 a quantizer property takes 12-15 s of one core (measured, session 11)
# and the ~300 of them on a GPU leg were most of its second step (past 6 minutes on an H200 with 16 workers);
# the database carries every failure from night to night, so depth accumulates where it matters
settings.register_profile(
    "nightly", max_examples=500, deadline=None, database=_DB, print_blob=True, suppress_health_check=_SLOW_OK,
)
_PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "dev")
if _PROFILE not in ("dev", "ci", "nightly"):  # conftest.PROFILES, checked before it is defined
    raise pytest.UsageError(f"HYPOTHESIS_PROFILE={_PROFILE!r}: expected one of dev, ci, nightly (conftest.py)")
settings.load_profile(_PROFILE)


pytest_plugins = ["harness.outputs.pytest_plugin"]  # --report DIR: the conformance report

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One thread per xdist worker: workers x torch threads on few cores thrash (seen: 2x slower). The processes a
    # test starts (harness CLI runs, compile_check, ranks) too, through the environment they inherit: with their
    # default of a thread a core, suites/test_harness_spine.py, test_hostile_backends.py and test_detection_power.py
    # took 99 s under -n 2 on CI's two cores, 75 s with one thread each (session 41)
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    from harness.platforms import pin_worker_to_gpu

    torch.set_num_threads(1)
    pin_worker_to_gpu(os.environ["PYTEST_XDIST_WORKER"])  # several GPUs: worker N on GPU N mod count


def pytest_addoption(parser):
    group = parser.getgroup("moe-conformance")
    group.addoption("--backend", action="append", default=[], metavar="NAME|module:factory",
                    help="run the conformance suites on these backends only (repeatable)")
    # suites/bench's option lives here: a sub-directory conftest's options are unknown when pytest starts
    group.addoption("--bench-dir", default=None, metavar="DIR",
                    help="write the benchmark table, results.json, rows.jsonl and roofline plot (suites/bench) into DIR")
    group.addoption("--case-timeout", type=float, default=None, metavar="SECONDS",
                    help="time limit of each backend call (default 300 s on CPU, 900 s on a GPU; 0: none)")
    group.addoption("--checkpoint", default=None, metavar="DIR",
                    help="judge the conformance cases on one MoE layer of this safetensors checkpoint (ModelOpt NVFP4, "
                         "compressed-tensors NVFP4 or FP8, AMD Quark OCP MXFP4, gpt-oss MXFP4): its scheme, activation "
                         "and sizes; inputs still drawn")
    group.addoption("--layer", type=int, default=0, metavar="N", help="with --checkpoint: the decoder layer (default 0)")
    group.addoption("--activation", default=None, metavar="NAME",
                    help="with --checkpoint: the MoE activation (default: config.json's hidden_act; SWIGLUOAI for "
                         "gpt-oss's layout; else SILU)")
    group.addoption("--repro", default=None, metavar="DIR",
                    help="for each failing conformance case write DIR/<case>/case.pt and repro.py, shrunk to the "
                         "fewest tokens and experts that still fail")


PROFILES = ("dev", "ci", "nightly")


def _use_checkpoint(config) -> None:
    """--checkpoint DIR --layer N: the conformance cases run on that layer (harness.core.conformance.use_checkpoint),
    in the controller and in every xdist worker; a layer that cannot be read is a usage error naming why."""
    path = config.getoption("--checkpoint")
    if path is None:
        return
    from harness.core.conformance import use_checkpoint
    from harness.inputs.checkpoints_on_disk import load_moe_layer

    layer, act = config.getoption("--layer"), config.getoption("--activation")
    try:
        ckpt = load_moe_layer(path, layer, activation=act)
    except (OSError, ValueError, TypeError, ImportError, KeyError) as exc:
        raise pytest.UsageError(f"--checkpoint {path} --layer {layer}: {exc}") from None
    use_checkpoint(ckpt, f"{path} layer {layer}")


@pytest.hookimpl(tryfirst=True)  # before Hypothesis's own plugin loads the profile (an INTERNALERROR otherwise)
def pytest_configure(config):
    from harness.backends import load_backend, registered_backends

    profile = config.getoption("hypothesis_profile", None)
    if profile is not None and profile not in PROFILES:
        raise pytest.UsageError(f"--hypothesis-profile {profile}: expected one of {', '.join(PROFILES)} (conftest.py)")

    for p in PLATFORMS.values():  # markers come from the platform data: a new platform is one record
        config.addinivalue_line("markers", f"{p.name}: must hold on {p.description}")
    config.addinivalue_line("markers", "gpu_queue: waits for a place on the GPU (harness.core.real_shapes."
                            "gpu_case_slot); scheduled after every other test, so that its wait holds no worker")
    config.addinivalue_line("markers", "long: one of a run's longest tests (minutes on 2 cores); scheduled first, with "
                            "the Hypothesis properties, so that it never runs alone at the end of a run")

    timeout = config.getoption("--case-timeout")
    if timeout is not None:  # the environment carries it to xdist workers
        if not (timeout >= 0 and timeout < float("inf")):
            raise pytest.UsageError(f"--case-timeout {timeout:g}: must be a number of seconds >= 0 (0: no limit)")
        os.environ["MOE_CONFORMANCE_CASE_TIMEOUT"] = str(timeout)
    repro = config.getoption("--repro")
    if repro is not None and os.path.exists(repro) and not os.path.isdir(repro):
        raise pytest.UsageError(f"--repro {repro}: is an existing file; --repro wants a directory to write into")
    _use_checkpoint(config)
    specs = config.getoption("--backend")
    if specs:
        loaded = []
        for spec in specs:
            try:
                loaded.append((spec, load_backend(spec)))
            except Exception as exc:  # noqa: BLE001 - one line naming the --backend value, not an INTERNALERROR
                raise pytest.UsageError(f"--backend {spec}: {type(exc).__name__}: {exc}") from None
        names: dict[str, str] = {}
        for spec, b in loaded:
            if b.name in names:
                raise pytest.UsageError(f"--backend {names[b.name]} and --backend {spec} both make a backend named "
                                        f"{b.name!r}: give them distinct names (the later would replace the earlier)")
            names[b.name] = spec
        config.moe_backends = {b.name: b for _, b in loaded}
        config.moe_backend_specs = {b.name: spec for spec, b in loaded}
    else:
        config.moe_backends = registered_backends()
        config.moe_backend_specs = {name: name for name in config.moe_backends}


def pytest_generate_tests(metafunc):
    if "model_share" in metafunc.fixturenames:  # suites/test_model_shapes.py: (share, scheme)
        from harness.core.real_shapes import model_share_cases

        gpus = [getattr(pytest.mark, p.name) for p in PLATFORMS.values() if p.is_gpu]
        metafunc.parametrize("model_share", [pytest.param(c, marks=gpus, id="/".join(c))
                                             for c in model_share_cases()])
    if "conformance_case" in metafunc.fixturenames or "backend_name" in metafunc.fixturenames:
        backends = metafunc.config.moe_backends
        if "backend_name" in metafunc.fixturenames:
            metafunc.parametrize("backend_name", sorted(backends))
            return
        params, _ = _conformance_params(metafunc.config)
        metafunc.parametrize("conformance_case", params)


def _lean(config) -> bool:
    """The ci profile without --report: conformance cases whose skip is known at collection are not collected
    (~14,000 of make test's ~16,000 items; each skipped item costs xdist ~3 ms, ~45 s of CI's 10 minutes); the
    terminal summary lists them by reason. make conformance (--report) and the dev and nightly profiles keep every
    case with its skip."""
    return _profile(config) == "ci" and not config.getoption("--report", None)


def _conformance_params(config):
    """(pytest params of the conformance cases, Counter of the skip reasons of those left out)."""
    from collections import Counter

    from harness.core.conformance import ci_thinned_out, conformance_cases

    backends, ci, lean = config.moe_backends, _profile(config) == "ci", _lean(config)
    params, left_out = [], Counter()
    for case, reason in conformance_cases(backends):
        reason = reason or (ci and ci_thinned_out(backends[case.backend_name], case))
        if reason and lean:
            left_out[reason] += 1
            continue
        marks = [getattr(pytest.mark, case.platform.name)]
        if reason:
            marks.append(pytest.mark.skip(reason=reason))
        params.append(pytest.param(case, marks=marks, id=case.id))
    return params, left_out


def pytest_terminal_summary(terminalreporter, config):
    ran = (r.nodeid for reports in terminalreporter.stats.values() for r in reports if hasattr(r, "nodeid"))
    if not _lean(config) or not any("::test_conformance[" in n for n in ran):
        return
    _, left_out = _conformance_params(config)
    if left_out:
        terminalreporter.write_sep("-", f"{sum(left_out.values())} conformance cases not collected (ci profile "
                                   "without --report; make conformance or the dev profile runs or skips each)")
        for reason, n in left_out.most_common():
            terminalreporter.write_line(f"NOT COLLECTED [{n}] {reason}")


def pytest_collection_modifyitems(config, items):
    from harness.outputs.report import CASE_IDENTITY, case_identity

    for item in items:
        case = getattr(item, "callspec", None) and item.callspec.params.get("conformance_case")
        if case is not None:  # the report reads each case's identity from here (it crosses xdist)
            item.user_properties.append((CASE_IDENTITY, case_identity(case)))
        if not any(item.get_closest_marker(m) for m in PLATFORMS):
            for m in PLATFORMS:  # platform-independent: must hold everywhere
                item.add_marker(getattr(pytest.mark, m))
    # Hypothesis properties and tests marked long first: under xdist they are a run's longest tests (100 examples
    # each on a nightly leg; the sm90 compile check), so they start at once, side by side, and the short cases fill
    # the workers around them. Tests that queue for the GPU last: a worker waiting in that queue could otherwise
    # have run the short cases
    items.sort(key=lambda item: (2 if item.get_closest_marker("gpu_queue") else
                                 0 if item.get_closest_marker("long") or
                                 getattr(getattr(item, "obj", None), "is_hypothesis_test", False) else 1))


@pytest.fixture(scope="session")
def hypothesis_profile(request) -> str:
    """The Hypothesis profile of this run. The ci profile also bounds the non-Hypothesis breadth tests (shape
    classes, sharded cases): each combination runs one of its variants in turn, where dev and nightly run all."""
    return _profile(request.config)


def _profile(config) -> str:
    return config.getoption("hypothesis_profile", None) or os.environ.get("HYPOTHESIS_PROFILE", "dev")


@pytest.fixture(scope="session")
def backends(request):
    return request.config.moe_backends
