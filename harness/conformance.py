"""One conformance case, as values: case -> reference -> backend -> comparison. The assert is the
caller's (suites/test_conformance.py); the report (harness.report) reads the same results."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from reference.activations import ACTIVATIONS, Activation, activation_by_name
from reference.checkpoints import MoECheckpoint, make_checkpoint
from reference.moe import MoETrace, fused_moe
from reference.routing import RoutingConfig, route
from reference.formats import E2M1
from reference.fp8 import FP8_FORMATS, Granularity, quantize_fp8
from reference.mx import MX_ELEMENT_FORMATS, ScaleMode, quantize_mx
from reference.nvfp4 import quantize_nvfp4
from reference.schemes import SCHEMES, Scheme, scheme_by_name

from .backends import Problem, backend_accumulation_error, backend_available, backend_operand_dtype
from .platforms import Platform
from .tolerances import Comparison, Exact, compare, moe_error_bound

__all__ = ["Shape", "SHAPES", "ConformanceCase", "skip_reason", "run_case", "reference_run", "conformance_cases",
           "QUANTIZER_CASES", "quantizer_cases", "quantizer_property", "reference_quantize"]


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


# ---- quantizer entry points -------------------------------------------------------------------------

QUANTIZER_CASES = [
    ("quantize_mx", dict(elem=elem, scale_mode=mode)) for elem in MX_ELEMENT_FORMATS for mode in (ScaleMode.FLOOR, ScaleMode.RCEIL)
] + [
    ("quantize_nvfp4", dict(global_decode_scale=torch.tensor(0.01))),
] + [
    ("quantize_fp8", dict(fmt=fmt, granularity=g, block_shape=b, scale=s))
    for fmt in FP8_FORMATS
    for g, b, s in ((Granularity.PER_TOKEN, None, None), (Granularity.PER_BLOCK, (1, 32), None),
                    (Granularity.PER_TENSOR, None, torch.tensor(0.05)))
]


def quantizer_cases(backend) -> list[tuple[str, dict]]:
    """The (entry point, parameters) pairs this backend exposes an entry point for."""
    return [(e, p) for e, p in QUANTIZER_CASES if hasattr(backend, e)]


def reference_quantize(entry: str, x: torch.Tensor, params: dict):
    if entry == "quantize_mx":
        return tuple(quantize_mx(x, params["elem"], scale_mode=params["scale_mode"]))
    if entry == "quantize_nvfp4":
        q = quantize_nvfp4(x, global_decode_scale=params["global_decode_scale"])
        return q.codes, q.block_scales
    return tuple(quantize_fp8(x, params["fmt"], granularity=params["granularity"], block_shape=params["block_shape"],
                              scale=params["scale"]))


def quantizer_property(backend, hypothesis_settings):
    """A Hypothesis property (call it to run it): every exposed entry point returns the reference's codes
    and scales bit for bit, on structured tensors (harness.strategies.mx_tensor)."""
    from hypothesis import assume, given
    from hypothesis import strategies as st

    from .strategies import mx_tensor

    cases = quantizer_cases(backend)

    @hypothesis_settings
    @given(data=st.data())
    def entry_points_are_bit_exact(data):
        entry, params = data.draw(st.sampled_from(cases), label="entry point")
        fmt = params.get("elem", params.get("fmt", E2M1))
        x = torch.nan_to_num(data.draw(mx_tensor(fmt, rows=2)), posinf=1e30, neginf=-1e30).clamp(-1e30, 1e30)
        if entry != "quantize_mx":
            assume(x.abs().amax() < 1e4 * params.get("global_decode_scale", torch.tensor(1e30)))
        try:
            got = getattr(backend, entry)(x, **params)
        except NotImplementedError:
            assume(False)  # this backend does not implement these parameters: draw others
            return
        for name, e, g in zip(("codes", "scales"), reference_quantize(entry, x, params), got):
            c = compare(e, g.cpu(), Exact(), f"{backend.name}.{entry}({params}): {name}")
            assert c.ok, c.message()

    return entry_points_are_bit_exact


def conformance_cases(backends: dict, platforms=None):
    """Every (ConformanceCase, skip reason or None) for these backends on these platforms (default: all),
    in the order the suite parametrizes them."""
    from .platforms import PLATFORMS, detect_platform

    host = detect_platform()
    for bname in sorted(backends):
        for platform in (platforms or PLATFORMS.values()):
            for scheme in SCHEMES.values():
                for act in ACTIVATIONS.values():
                    case = ConformanceCase(bname, platform, scheme, act)
                    yield case, skip_reason(backends[bname], case, host)
