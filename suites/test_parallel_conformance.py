"""Sharded conformance on this machine's platform (make conformance runs it beside test_conformance.py):
with one process per rank and a real all-reduce (NCCL over GPUs when there are two or more, gloo over CPU
processes on a CPU host), and, on a GPU host, the simulated TP/EP cases with compiled kernels at GPU shapes.
The CPU-simulated suite with its seeded bugs is suites/test_parallel.py."""

from __future__ import annotations

import pytest

from harness.backends import load_backend, registered_backends
from harness.parallel import Parallelism
from harness.parallel.distributed import DistributedCase, run_distributed
from harness.parallel.sharding import PARALLEL_CASES, parallel_shape, run_parallel_case
from harness.platforms import detect_platform, gpu_count
from reference.activations import ACTIVATIONS
from reference.schemes import SCHEMES

HOST = detect_platform()
pytestmark = getattr(pytest.mark, HOST.name)  # selected by make conformance's -m <platform>
RANKED = (Parallelism(tp=2), Parallelism(ep=2))


def _runnable_backends() -> list[str]:
    return [n for n, b in registered_backends().items() if getattr(b, "available", lambda p: (True, ""))(HOST)[0]]


def _world() -> tuple[str | None, str]:
    if HOST.is_gpu:
        if gpu_count() >= 2:
            return "nccl", ""
        return None, f"one process per rank needs 2 GPUs; this {HOST.name} machine has {gpu_count()}"
    return "gloo", ""


@pytest.mark.parametrize("par", RANKED, ids=lambda p: p.label)
def test_sharded_over_ranks(par):
    """Every runnable backend x case over two ranks, the partial outputs all-reduced by the collective
    library. On the CPU host (gloo) one backend keeps make test short; GPU hosts run them all."""
    world, why = _world()
    if world is None:
        pytest.skip(why)
    backends = _runnable_backends() if world == "nccl" else ["torch_emulation"]
    cases = [DistributedCase(b, s, a, tp=par.tp, ep=par.ep) for b in backends for s, a in PARALLEL_CASES]
    verdicts = run_distributed(cases, world)
    failed = [v for v in verdicts if v["outcome"] == "failed"]
    assert not failed, "\n".join(f"{v['case']}: {v['reason']}" for v in failed)
    assert any(v["outcome"] == "passed" for v in verdicts)


@pytest.mark.skipif(not HOST.is_gpu, reason="the CPU host runs the simulated cases in suites/test_parallel.py")
@pytest.mark.parametrize("par", (Parallelism(tp=2), Parallelism(tp=4), Parallelism(ep=2)), ids=lambda p: p.label)
@pytest.mark.parametrize("scheme,act", PARALLEL_CASES)
@pytest.mark.parametrize("name", _runnable_backends())
def test_sharded_simulated_here(name, scheme, act, par):
    result = run_parallel_case(load_backend(name), SCHEMES[scheme], ACTIVATIONS[act], HOST, par,
                               parallel_shape(SCHEMES[scheme], True))
    if isinstance(result, str):
        pytest.skip(result)
    assert result.ok, result.message()
