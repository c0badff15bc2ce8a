"""One conformance case, as values: case -> reference -> backend -> comparison. The assert is the
caller's (suites/test_conformance.py); the report (harness.outputs.report) reads the same results."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from reference.activations import ACTIVATIONS, Activation, activation_by_name
from reference.checkpoints import MoECheckpoint, make_checkpoint
from reference.moe import MoETrace, fused_moe
from reference.routing import RoutingConfig, route
from reference.formats import E2M1
from reference.fp8 import FP8_FORMATS, Granularity, quantize_fp8
from reference.mx import MX_ELEMENT_FORMATS, ScaleMode, quantize_mx
from reference.nvfp4 import quantize_nvfp4
from reference.schemes import SCHEMES, Scheme
from reference.quantizers import FP8
from reference.structure import NumericalStructure

from harness.backends import (Declined, Problem, backend_available, backend_bound_declarations, backend_prepare, backend_structure, checked_supports, known_failure_for)
from harness.core.guard import check_unmodified, checkpoint_pairs, guarded_call, private_checkpoint, private_copy
from harness.platforms import Platform
from harness.core.structure_fit import conforming_structures
from harness.core.tolerances import Comparison, Exact, compare, moe_error_bound
from harness.inputs.shape_classes import present_inputs
from harness.inputs.strategies import mx_tensor
from harness.platforms import PLATFORMS, detect_platform
from reference.formats import format_by_name

__all__ = ["GivenCheckpoint", "use_checkpoint", "given_checkpoint", "conformance_shape", "runs_with_bias", "moe_property_examples", "NIGHTLY_MOE_EXAMPLES", "Shape", "SHAPES", "ConformanceCase", "skip_reason", "run_case", "reference_run", "conformance_cases",
           "QUANTIZER_CASES", "quantizer_cases", "case_checkpoint", "quantizer_property", "reference_quantize", "case_problem",
           "backend_shape", "checked_supports", "default_shape", "compare_backend", "case_inputs", "run_drawn_case",
           "ROUTINGS", "routed_ids", "run_shape_class_case", "shape_class_runs", "SHAPE_CLASS_SCHEMES"]


@dataclass(frozen=True)
class Shape:
    num_experts: int
    hidden_size: int
    intermediate_size: int
    tokens: int
    top_k: int


# Small shapes where kernels run under the interpreter (CPU); realistic ones on a GPU. H and I are
# multiples of 128 so that every scheme (FP8 128x128 blocks included) accepts them. top_k >= 3: with two
# bf16 terms a sequential bf16 sum equals an fp32 sum, so top_k = 2 could not tell the structures apart.
SHAPES = {
    "cpu": Shape(num_experts=4, hidden_size=128, intermediate_size=128, tokens=8, top_k=3),
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


def backend_shape(backend, shape: Shape) -> Shape:
    """The shape a backend's cases run at: top_k capped where its structure is defined for fewer (the
    router weight in GEMM1's epilogue: top_k = 1)."""
    cap = backend_structure(backend).max_top_k
    return shape if cap is None or shape.top_k <= cap else dataclasses.replace(shape, top_k=cap)


def case_problem(backend, scheme: Scheme, activation: Activation, platform: Platform, shape: Shape,
                 tokens: int | None = None) -> tuple[Problem, bool, str]:
    """(the Problem a case will run, whether the backend supports it, its reason). Checkpoints carry
    biases wherever the backend takes them (a bias in the wrong place must show); a backend that takes
    none gets the same case without."""
    shape = backend_shape(backend, shape)
    biased = Problem(scheme, activation, shape.num_experts, shape.hidden_size, shape.intermediate_size,
                     shape.tokens if tokens is None else tokens, shape.top_k, has_bias=True)
    ok, reason = checked_supports(backend, biased, platform)
    if ok:
        return biased, ok, reason
    plain = dataclasses.replace(biased, has_bias=False)
    ok_plain, reason_plain = checked_supports(backend, plain, platform)
    return (plain, True, reason_plain) if ok_plain else (plain, False, reason)


def skip_reason(backend, case: ConformanceCase, host_platform: Platform, shape: Shape | None = None) -> str | None:
    """The one place that decides whether a conformance case runs here, and if not, why."""
    shape = shape or conformance_shape(host_platform)
    _, ok, reason = case_problem(backend, case.scheme, case.activation, case.platform, shape)
    if not ok:
        return f"{backend.name}: {reason}"
    ok, reason = backend_available(backend, case.platform)
    if not ok:
        return f"{backend.name} on this {host_platform.name} machine: {reason}"
    # A backend that simulates another platform's semantics here runs only the cases whose semantics
    # differ from this machine's platform: platforms differ only in their FP8 dtype.
    if case.platform is not host_platform:
        uses_fp8 = any(q.kind is FP8 for q in (case.scheme.weight, case.scheme.act) if q is not None)
        if not uses_fp8 or case.platform.fp8_format is host_platform.fp8_format:
            return (f"{backend.name}: same semantics as the {host_platform.name} case on this machine "
                    "(platforms differ only in the FP8 dtype)")
    return None


def default_shape(host_platform: Platform) -> Shape:
    return SHAPES["gpu" if host_platform.is_gpu else "cpu"]


@dataclass(frozen=True)
class GivenCheckpoint:
    """A checkpoint the run is judged on instead of generated ones (pytest --checkpoint DIR --layer N): the
    conformance cases become its scheme and activation at its sizes; hidden states and routing are still drawn."""

    ckpt: MoECheckpoint
    source: str  # where it came from, for messages

    def matches(self, scheme: str, act: str, fp8_name: str, shape: Shape) -> bool:
        c = self.ckpt
        return (c.scheme.name, c.activation.name, c.fp8_format.name) == (scheme, act, fp8_name) and (
            c.num_experts, c.hidden_size, c.intermediate_size) == (shape.num_experts, shape.hidden_size,
                                                                   shape.intermediate_size)


_GIVEN: list[GivenCheckpoint] = []  # at most one: set once per process by conftest.py from --checkpoint


def use_checkpoint(ckpt: MoECheckpoint | None, source: str = "") -> None:
    """Judge this process's conformance cases on `ckpt` (None: generated checkpoints again)."""
    _GIVEN.clear()
    case_checkpoint.cache_clear()
    reference_run.cache_clear()
    if ckpt is not None:
        _GIVEN.append(GivenCheckpoint(ckpt, source))


def given_checkpoint() -> GivenCheckpoint | None:
    return _GIVEN[0] if _GIVEN else None


def runs_with_bias(problem: Problem) -> bool:
    """Does the case carry biases: where the backend takes them, unless a given checkpoint has none."""
    given = given_checkpoint()
    return problem.has_bias and (given is None or given.ckpt.b13 is not None or given.ckpt.b2 is not None)


def conformance_shape(host_platform: Platform) -> Shape:
    """The shape the conformance cases run at: the given checkpoint's sizes (tokens as the platform's, top_k capped
    by its experts), else the platform's default."""
    shape = default_shape(host_platform)
    given = given_checkpoint()
    if given is None:
        return shape
    c = given.ckpt
    return Shape(c.num_experts, c.hidden_size, c.intermediate_size, shape.tokens, min(shape.top_k, c.num_experts))


@functools.lru_cache(maxsize=64)
def case_checkpoint(scheme: str, act: str, fp8_name: str, shape: Shape, seed: int, bias: bool = True) -> MoECheckpoint:
    given = given_checkpoint()
    if given is not None and given.matches(scheme, act, fp8_name, shape):
        return given.ckpt  # as it is on disk: its biases (or none), its scales, its NVFP4 direction
    return make_checkpoint(scheme, act, shape.num_experts, shape.hidden_size, shape.intermediate_size, seed=seed,
                           with_bias=bias, fp8_format=format_by_name(fp8_name))


# Router weights that matter: sigmoid scores without renormalization, scaled by 2.5 (DeepSeek-V3's factor),
# so they are neither 1 at top_k = 1 nor a partition of 1, and some exceed 1: a weight dropped, applied
# twice or applied on the wrong side of the activation changes outputs everywhere.
CASE_ROUTING = dict(scoring="sigmoid", renormalize=False, routed_scaling_factor=2.5)


def case_inputs(shape: Shape, seed: int, tokens: int | None = None):
    t = shape.tokens if tokens is None else tokens
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(t, shape.hidden_size, generator=g) * 2).to(torch.bfloat16)
    logits = torch.randn(t, shape.num_experts, generator=g) * 2
    w, ids = route(logits, RoutingConfig(top_k=shape.top_k, **CASE_ROUTING))
    return x, w, ids


@functools.lru_cache(maxsize=64)
def reference_run(scheme: str, act: str, fp8_name: str, shape: Shape, seed: int, structure: NumericalStructure,
                  bias: bool = True):
    ckpt = case_checkpoint(scheme, act, fp8_name, shape, seed, bias)
    x, w, ids = case_inputs(shape, seed)
    out, trace = fused_moe(x, ckpt, w, ids, structure=structure, trace=True)
    return ckpt, (x, w, ids), out, trace


def compare_backend(backend, ckpt: MoECheckpoint, inputs, out: torch.Tensor, trace: MoETrace, what: str,
                    present=None, diagnose: bool = True) -> Comparison:
    """Run the backend on a case and compare with the reference output computed with its declared
    structure. prepare() may decline the checkpoint (NotImplementedError): Declined propagates.
    present(x, w, ids) -> (x, w, ids): how the inputs are handed over (the same values; a strided view, int32
    ids: harness.inputs.shape_classes), on the backend's device."""
    structure = backend_structure(backend)
    if trace.structure != structure:
        raise ValueError(f"{what}: the reference was computed with structure {trace.structure.name!r}, but "
                         f"{backend.name} declares {structure.name!r}")
    device = getattr(backend, "device", "cpu")
    # private copies: inputs and checkpoints are cached and shared, and a backend may write into its own
    # a backend on the host gets the checkpoint there (a real-shape case builds it on the GPU, for the reference)
    on_host = str(device) == "cpu" and ckpt.w13.data.device.type != "cpu"
    given = ckpt.map_tensors(lambda t: t.to("cpu", copy=True)) if on_host else private_checkpoint(ckpt)
    prepared = guarded_call(backend, what, "prepare()", backend_prepare, backend, given)
    check_unmodified(what, "prepare()", checkpoint_pairs(ckpt, given))
    originals = [t.to(device) for t in inputs]
    if present is not None:
        originals = list(present(*originals))
    x, w, ids = (private_copy(t) for t in originals)
    got = guarded_call(backend, what, "forward()", backend.forward, prepared, x, w, ids)
    check_unmodified(what, "forward()", [("hidden_states", originals[0], x), ("topk_weights", originals[1], w),
                                         ("topk_ids", originals[2], ids), *checkpoint_pairs(ckpt, given)])
    check_output(what, got, tuple(inputs[0].shape))
    declarations = backend_bound_declarations(backend, ckpt.scheme.name)
    # the reference side runs where the reference ran: the host, or (real model shapes, harness.core.real_shapes)
    # the GPU in float64; the comparison itself on the host
    ref_device = out.device
    ref_inputs = [t.to(ref_device) for t in inputs]  # inputs may be on the backend's device (poisoned)
    with torch.device(ref_device):
        bound = moe_error_bound(trace, ckpt, **declarations).to("cpu")
        result = compare(out.cpu(), got.cpu(), bound, f"{what}: output", structure=structure)
        if not result.ok and result.worst_index is not None:  # say who is closer to the exact value
            exact = fused_moe(*ref_inputs[:1], ckpt, *ref_inputs[1:], structure=structure, exact=True).cpu()
            result = compare(out.cpu(), got.cpu(), bound, f"{what}: output", structure=structure, exact=exact)
        if diagnose and not result.ok and result.n_nonfinite == 0:  # and which structure it does follow, if any
            fits = conforming_structures(got.to(ref_device), ckpt, ref_inputs, structure, declarations)
            result = dataclasses.replace(result, structure_fits=tuple(fits))
    return result


ROUTINGS = ("random", "all_to_one", "skip_experts")


def routed_ids(routing: str, ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """The top-k ids a routing gives: "random" (the router's), "all_to_one" (every token to experts 0..k-1)
    or "skip_experts" (every token to the last k experts: the others get none, the last id is used)."""
    tokens, k = ids.shape
    if routing == "all_to_one":
        return torch.arange(k).repeat(tokens, 1)
    if routing == "skip_experts":
        return torch.arange(num_experts - k, num_experts).repeat(tokens, 1)
    if routing != "random":
        raise ValueError(f"routing must be one of {ROUTINGS}, got {routing!r}")
    return ids


def run_drawn_case(backend, scheme: str, act: str, platform: Platform, shape: Shape, seed: int, tokens: int,
                   top_k: int, routing: str) -> Comparison | str:
    """One case of the Hypothesis run: `tokens` tokens, top_k capped by the experts and the backend's
    structure, routing "random", "all_to_one" (experts 0..k-1) or "skip_experts" (only the last k get
    tokens). The comparison, or the reason it did not run (unsupported shape, declined checkpoint)."""
    base = backend_shape(backend, shape)
    cap = backend_structure(backend).max_top_k or base.num_experts
    shape = dataclasses.replace(base, top_k=min(top_k, cap, base.num_experts))
    problem, ok, reason = case_problem(backend, SCHEMES[scheme], ACTIVATIONS[act], platform, shape, tokens)
    if not ok:
        return f"{backend.name} does not support {scheme}/{act} at top_k={shape.top_k}: {reason}"
    k = shape.top_k
    ckpt = case_checkpoint(scheme, act, platform.fp8_format.name, base, seed % 4, problem.has_bias)
    x, w, ids = case_inputs(shape, seed, tokens)
    ids = routed_ids(routing, ids, shape.num_experts)
    out, trace = fused_moe(x, ckpt, w, ids, structure=backend_structure(backend), trace=True)
    what = f"{scheme}/{act}/{backend.name}/{platform.name} (tokens={tokens}, top_k={k}, {routing})"
    try:
        return compare_backend(backend, ckpt, (x, w, ids), out, trace, what)
    except Declined as declined:
        return str(declined)


SHAPE_CLASS_SCHEMES = ("bf16", "w_mxfp4", "w_nvfp4", "w_fp8_a_fp8", "w_fp8_a_fp8_block")  # one per block family


def shape_class_shape(backend, shape_class) -> Shape:
    """The class's shape, top_k capped where the backend's structure is defined for fewer (backend_shape)."""
    return backend_shape(backend, Shape(*shape_class.shape_fields))


def shape_class_runs(backend, scheme: str, shape_class, platform: Platform):
    """(Problem, activation name) a shape class runs with for this scheme, or the reason it does not run: the
    scheme's blocks do not divide the class's H or I, the backend's structure or supports() declines it."""
    sch = SCHEMES[scheme]
    shape = shape_class_shape(backend, shape_class)
    e, h, i, tokens, k = shape_class.shape_fields
    block = sch.k_multiple()
    if h % block or i % block or (2 * i) % sch.n_multiple() or h % sch.n_multiple():
        return (f"{scheme}'s blocks ({block} along K) do not divide H = {h}, I = {i}: real checkpoints of this "
                "scheme keep H and each TP share of I in whole blocks (harness.inputs.shape_classes)")
    cap = backend_structure(backend).max_top_k
    if cap is not None and k > cap and shape_class.top_k_is_the_property:
        return f"{backend.name}'s structure {backend_structure(backend).name} is defined for top_k <= {cap}, not {k}"
    acts = [shape_class.activation] + [a for a in ACTIVATIONS if a != shape_class.activation]
    reason = ""
    for act in acts:
        problem, ok, why = case_problem(backend, sch, ACTIVATIONS[act], platform, shape)
        if ok:
            return problem, act
        reason = reason or why
    return f"{backend.name} does not support {scheme} at {shape_class.name} {shape_class.shape_fields}: {reason}"


def run_shape_class_case(backend, scheme: str, shape_class, platform: Platform, seed: int = 0,
                         diagnose: bool = True) -> Comparison | str:
    """One shape class (harness.inputs.shape_classes) for one scheme: the comparison, or why it does not run
    (shape_class_runs; or prepare() declines the checkpoint)."""
    runs = shape_class_runs(backend, scheme, shape_class, platform)
    if isinstance(runs, str):
        return runs
    problem, act = runs
    shape = shape_class_shape(backend, shape_class)
    e = shape.num_experts
    ckpt = case_checkpoint(scheme, act, platform.fp8_format.name, shape, seed, problem.has_bias)
    x, w, ids = case_inputs(shape, seed)
    ids = routed_ids(shape_class.routing, ids, e)
    out, trace = fused_moe(x, ckpt, w, ids, structure=backend_structure(backend), trace=True)
    what = (f"{scheme}/{act}/{backend.name}/{platform.name} at shape class {shape_class.name}: experts {e}, "
            f"H {shape.hidden_size}, I {shape.intermediate_size}, tokens {shape.tokens}, top_k {shape.top_k}, "
            f"{shape_class.routing} routing, {shape_class.layout} hidden_states, {str(shape_class.ids_dtype)[6:]} ids "
            f"(from {shape_class.origin})")
    try:
        return compare_backend(backend, ckpt, (x, w, ids), out, trace, what,
                               present=lambda *t: present_inputs(shape_class, *t), diagnose=diagnose)
    except Declined as declined:
        return str(declined)


def check_output(what: str, got, shape: tuple[int, ...]) -> None:
    """forward()'s result must be a bf16 tensor of hidden_states' shape: say so, never compare garbage."""
    if not isinstance(got, torch.Tensor):
        raise TypeError(f"{what}: forward() must return a torch.Tensor, got {type(got).__name__}")
    if got.dtype != torch.bfloat16:
        raise TypeError(f"{what}: forward() must return bfloat16, got {got.dtype}")
    if tuple(got.shape) != shape:
        raise ValueError(f"{what}: forward() must return hidden_states' shape {shape}, got {tuple(got.shape)}")


def run_case(backend, case: ConformanceCase, shape: Shape, seed: int = 0, diagnose: bool = True) -> Comparison:
    problem, ok, reason = case_problem(backend, case.scheme, case.activation, case.platform, shape)
    if not ok:
        raise ValueError(f"{case.id}: {backend.name} does not support this case ({reason})")
    shape = backend_shape(backend, shape)
    ckpt, inputs, out, trace = reference_run(
        case.scheme.name, case.activation.name, case.platform.fp8_format.name, shape, seed,
        backend_structure(backend), problem.has_bias,
    )
    given = given_checkpoint()
    what = case.id if given is None or ckpt is not given.ckpt else f"{case.id} on {given.source}"
    return compare_backend(backend, ckpt, inputs, out, trace, what, diagnose=diagnose)


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
    and scales bit for bit, on structured tensors (harness.inputs.strategies.mx_tensor)."""
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


CI_ACTIVATION_STRIDE = 4


# Examples per profile of a Hypothesis property whose every example runs a whole MoE (reference, bound, backend):
# the nightly profile's max_examples (500) is sized for quantizer-sized examples, and 500 MoE examples are many
# minutes of one core, the length of a nightly leg by themselves; other profiles keep their own (or the caller's)
NIGHTLY_MOE_EXAMPLES = 100


def moe_property_examples(otherwise: int | None = None) -> int:
    """max_examples for a whole-MoE property under the current Hypothesis profile."""
    if settings.get_current_profile_name() == "nightly":
        return NIGHTLY_MOE_EXAMPLES
    return otherwise if otherwise is not None else settings.default.max_examples


def ci_thinned_out(backend, case: ConformanceCase) -> str | None:
    """Why the ci profile leaves this explicit case out (None: it runs). make test must fit CI's 10 minutes on 2
    cores, and the Triton interpreter costs ~0.6 s a case: each backend runs every scheme with SILU (the
    activation most models use, and the one README's examples name) and every fourth other activation, the
    choice rotating with the scheme, so that every scheme and every activation run (each with several partners). A (backend, scheme) with a declared known failure runs whole (its strict xfail is the
    record). dev (README's "Run it") and nightly run every case."""
    if given_checkpoint() is not None:
        return None  # --checkpoint: one (scheme, activation) per backend, the checkpoint's; nothing to thin out
    schemes, acts = list(SCHEMES), list(ACTIVATIONS)
    if case.activation.name == "SILU" or (
            schemes.index(case.scheme.name) + acts.index(case.activation.name)) % CI_ACTIVATION_STRIDE == 0:
        return None
    if known_failure_for(backend, case.scheme.name, True) or known_failure_for(backend, case.scheme.name, False):
        return None
    return (f"ci profile: {case.scheme.name} runs SILU and one activation in {CI_ACTIVATION_STRIDE} here, in turn "
            "(dev and nightly: all)")


def conformance_cases(backends: dict, platforms=None, host: Platform | None = None):
    """Every (ConformanceCase, skip reason or None) for these backends on these platforms (default: all),
    in the order the suite parametrizes them. host: the machine the skip reasons assume (default: this one;
    the catalog passes cpu so that its checks are the same on every host)."""
    host = host or detect_platform()
    given = given_checkpoint()
    for bname in sorted(backends):
        for platform in (platforms or PLATFORMS.values()):
            for scheme in SCHEMES.values():
                for act in ACTIVATIONS.values():
                    case = ConformanceCase(bname, platform, scheme, act)
                    if given is not None and not given.matches(scheme.name, act.name, platform.fp8_format.name,
                                                               conformance_shape(host)):
                        continue  # a run on a given checkpoint judges its scheme, activation and FP8 dtype only
                    try:
                        reason = skip_reason(backends[bname], case, host)
                    except Exception:  # noqa: BLE001 - a broken supports()/available() fails this backend's
                        reason = None  # cases alone, with its message, when they run; never the collection
                    yield case, reason
