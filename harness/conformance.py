"""One conformance case, as values: case -> reference -> backend -> comparison. The assert is the
caller's (suites/test_conformance.py); the report (harness.report) reads the same results."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from reference.activations import Activation, activation_by_name
from reference.checkpoints import MoECheckpoint, make_checkpoint
from reference.moe import MoETrace, fused_moe
from reference.routing import RoutingConfig, route
from reference.schemes import Scheme, scheme_by_name

from .backends import Problem, backend_accumulation_error, backend_available, backend_operand_dtype
from .platforms import Platform
from .tolerances import Comparison, compare, moe_error_bound

__all__ = ["Shape", "SHAPES", "ConformanceCase", "skip_reason", "run_case", "reference_run"]


@dataclass(frozen=True)
class Shape:
    num_experts: int
    hidden_size: int
    intermediate_size: int
    tokens: int
    top_k: int


# Small shapes where kernels run under the interpreter (CPU); realistic ones on a GPU. H and I are
# multiples of 128 so that every scheme (FP8 128x128 blocks included) accepts them.
SHAPES = {
    "cpu": Shape(num_experts=4, hidden_size=128, intermediate_size=128, tokens=8, top_k=2),
    "gpu": Shape(num_experts=8, hidden_size=512, intermediate_size=256, tokens=64, top_k=4),
}


@dataclass(frozen=True)
class ConformanceCase:
    backend_name: str
    platform: Platform
    scheme: Scheme
    activation: Activation

    @property
    def id(self) -> str:
        return f"{self.scheme.name}/{self.activation.name}/{self.backend_name}/{self.platform.name}"


def skip_reason(backend, case: ConformanceCase, host_platform: Platform) -> str | None:
    """The one place that decides whether a conformance case runs here, and if not, why."""
    problem = Problem(case.scheme, case.activation, has_bias=_has_bias(case.activation.name))
    ok, reason = backend.supports(problem, case.platform)
    if not ok:
        return f"{backend.name}: {reason}"
    ok, reason = backend_available(backend, case.platform)
    if not ok:
        return f"{backend.name} on this {host_platform.name} machine: {reason}"
    # A backend that simulates another platform's semantics here runs only the cases whose semantics
    # differ from this machine's platform: platforms differ only in their FP8 dtype.
    if case.platform is not host_platform:
        uses_fp8 = "fp8" in {q.kind for q in (case.scheme.weight, case.scheme.act) if q is not None}
        if not uses_fp8 or case.platform.fp8_format is host_platform.fp8_format:
            return (f"{backend.name}: same semantics as the {host_platform.name} case on this machine "
                    "(platforms differ only in the FP8 dtype)")
    return None


def _has_bias(act: str) -> bool:
    return act == "SWIGLUOAI"  # gpt-oss's experts carry biases; the conformance checkpoints follow


@functools.lru_cache(maxsize=64)
def _checkpoint(scheme: str, act: str, fp8_name: str, shape: Shape, seed: int) -> MoECheckpoint:
    from reference.formats import format_by_name

    return make_checkpoint(scheme, act, shape.num_experts, shape.hidden_size, shape.intermediate_size, seed=seed,
                           with_bias=_has_bias(act), fp8_format=format_by_name(fp8_name))


def case_inputs(shape: Shape, seed: int, tokens: int | None = None):
    t = shape.tokens if tokens is None else tokens
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(t, shape.hidden_size, generator=g) * 2).to(torch.bfloat16)
    w, ids = route(torch.randn(t, shape.num_experts, generator=g), RoutingConfig(top_k=shape.top_k))
    return x, w, ids


@functools.lru_cache(maxsize=64)
def reference_run(scheme: str, act: str, fp8_name: str, shape: Shape, seed: int):
    ckpt = _checkpoint(scheme, act, fp8_name, shape, seed)
    x, w, ids = case_inputs(shape, seed)
    out, trace = fused_moe(x, ckpt, w, ids, trace=True)
    return ckpt, (x, w, ids), out, trace


def compare_backend(backend, ckpt: MoECheckpoint, inputs, out: torch.Tensor, trace: MoETrace, what: str) -> Comparison:
    device = getattr(backend, "device", "cpu")
    x, w, ids = (t.to(device) for t in inputs)
    prepared = backend.prepare(ckpt)
    got = backend.forward(prepared, x, w, ids)
    if not isinstance(got, torch.Tensor) or got.dtype != torch.bfloat16:
        raise TypeError(f"{what}: forward must return a bfloat16 tensor, got {getattr(got, 'dtype', type(got))}")
    bound = moe_error_bound(trace, ckpt, backend_operand_dtype(backend), backend_accumulation_error(backend))
    return compare(out, got.cpu(), bound, f"{what}: output")


def run_case(backend, case: ConformanceCase, shape: Shape, seed: int = 0) -> Comparison:
    ckpt, inputs, out, trace = reference_run(
        case.scheme.name, case.activation.name, case.platform.fp8_format.name, shape, seed
    )
    return compare_backend(backend, ckpt, inputs, out, trace, case.id)


def problem_for(scheme: str, act: str) -> Problem:
    return Problem(scheme_by_name(scheme), activation_by_name(act), has_bias=_has_bias(act))
