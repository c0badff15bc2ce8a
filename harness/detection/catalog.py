"""The seeded-bug catalog: small buggy backends, each a wrapper of a correct one (torch emulation with
fp32 operands) that injects one real bug class, for proving that the suites catch it (issue 7: detection power).

Each mutant names the bug class it models (the README's "Detection power" lists them). hunt() runs the conformance
suite's own checks on a backend - the quantizer entry-point property (ci settings), then every
conformance case on the catalog platforms in the suite's order - and stops at the first failure;
suites/test_catalog.py (in `make test`) asserts that every mutant is caught and the control is not,
and `python -m harness catalog` prints which check caught each mutant and how long it took.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable

import torch

from hypothesis import settings

from harness.backends import Declined
from harness.backends.emulation import moe_emulation
from harness.backends.torch_emulation import TorchEmulationBackend
from harness.core.conformance import (SHAPE_CLASS_SCHEMES, SHAPES, conformance_cases, quantizer_cases,
                                      quantizer_property, run_case, run_shape_class_case)
from harness.inputs.shape_classes import SHAPE_CLASSES
from harness.platforms import PLATFORMS
from reference.checkpoints import MoECheckpoint
from reference.formats import E4M3FN, E4M3FNUZ, encode
from reference.fp8 import Granularity
from reference.moe import activation_qdq, static_activation_scales
from reference.mx import ScaleMode, quantize_mx
from reference.quantizers import FP8, MX, NVFP4
from reference.schemes import ActQuant

from reference.structure import DEFAULT_STRUCTURE, STRUCTURES, NumericalStructure, structure_by_name


__all__ = ["Mutant", "MUTANTS", "SHAPE_MUTANTS", "CONTROL", "make_mutant", "Catch", "hunt", "hunt_shapes",
           "CATALOG_PLATFORMS"]


@dataclass(frozen=True)
class Mutant:
    name: str
    bug: str
    prepare: Callable[[MoECheckpoint], MoECheckpoint] | None = None  # checkpoint as the buggy backend reads it
    forward: Callable | None = None  # (base_forward, prepared, x, w, ids) -> out
    quantize_mx: Callable | None = None  # a buggy quantizer entry point
    structure_computed: bool = False  # computes the next structure of STRUCTURES, not the declared one
    shape_only: bool = False  # shows only at shapes real layers have (harness.inputs.shape_classes)


_REGISTERED: list[Mutant] = []


def _mutant(name: str, bug: str, hook: str, shape_only: bool = False):
    """Register the decorated function as mutant `name`'s hook ("prepare", "forward" or "quantize_mx"): each
    seeded bug stands beside the code that plants it."""
    def register(fn):
        _REGISTERED.append(Mutant(name, bug, **{hook: fn}, shape_only=shape_only))
        return fn

    return register


def _with_act(ckpt: MoECheckpoint, **params) -> MoECheckpoint:
    return dataclasses.replace(ckpt, activation=dataclasses.replace(ckpt.activation, **params))


def _with_scheme_act(ckpt: MoECheckpoint, act: ActQuant | None) -> MoECheckpoint:
    return dataclasses.replace(ckpt, scheme=dataclasses.replace(ckpt.scheme, act=act))


@_mutant("fp4_nibble_order_swapped", "FP4 nibble order swapped", "prepare")
def _swap_nibbles(ckpt: MoECheckpoint) -> MoECheckpoint:
    wq = ckpt.scheme.weight
    if wq is None or wq.elem.nbits != 4:
        return ckpt
    swap = lambda w: dataclasses.replace(w, data=(w.data >> 4) | (w.data << 4))  # noqa: E731
    return dataclasses.replace(ckpt, w13=swap(ckpt.w13), w2=swap(ckpt.w2))


@_mutant("interleaved_read_as_halves", "gpt-oss interleaved gate/up weights read as halves", "prepare")
def _interleaved_as_halves(ckpt: MoECheckpoint) -> MoECheckpoint:
    # reads gpt-oss's interleaved gate/up rows as if they were [gate; up] halves
    if not ckpt.activation.interleaved:
        return ckpt
    return _with_act(ckpt, interleaved=False)


@_mutant("fp8_dtype_not_platforms", "FP8 dtype hard-coded e4m3fn instead of the platform's e4m3fnuz", "prepare")
def _fp8_dtype_not_platforms(ckpt: MoECheckpoint) -> MoECheckpoint:
    # a hard-coded e4m3fn: FNUZ codes read as FN (values halve: bias 8 vs 7)
    return dataclasses.replace(ckpt, fp8_format=E4M3FN) if ckpt.fp8_format is E4M3FNUZ else ckpt


@_mutant("nvfp4_global_scale_direction", "NVFP4 global scale applied in the wrong direction", "prepare")
def _nvfp4_global_direction(ckpt: MoECheckpoint) -> MoECheckpoint:
    if ckpt.scheme.weight is None or ckpt.scheme.weight.kind is not NVFP4:
        return ckpt
    flipped = "encode" if ckpt.nvfp4_global_convention == "decode" else "decode"
    return dataclasses.replace(ckpt, nvfp4_global_convention=flipped)


@_mutant("static_scale_ignored", "static input scale ignored, dynamic scale used", "prepare")
def _static_scale_ignored(ckpt: MoECheckpoint) -> MoECheckpoint:
    aq = ckpt.scheme.act
    if aq is None or aq.kind is not FP8 or not aq.static:
        return ckpt
    return _with_scheme_act(ckpt, ActQuant(FP8, aq.elem, Granularity.PER_TOKEN, None, static=False))


@_mutant("input_scale_not_max", "one expert's input scale used instead of the max over experts", "prepare")
def _a2_scale_not_max(ckpt: MoECheckpoint) -> MoECheckpoint:
    # one expert's input scale instead of the max over experts
    if ckpt.w2_input_scale is None:
        return ckpt
    pick = lambda s: torch.full_like(s, float(s[0]))  # noqa: E731
    return dataclasses.replace(ckpt, w13_input_scale=pick(ckpt.w13_input_scale), w2_input_scale=pick(ckpt.w2_input_scale))


@_mutant("weight_only_as_w4a4",
         "weight-only checkpoint run as W4A4: activations quantized that must stay bf16", "prepare")
def _weight_only_as_w4a4(ckpt: MoECheckpoint) -> MoECheckpoint:
    if not ckpt.scheme.weight_only:
        return ckpt
    return _with_scheme_act(ckpt, ActQuant(MX, ckpt.scheme.weight.elem if ckpt.scheme.weight.kind is MX
                                           else E4M3FN))


@_mutant("swiglu_limit_ignored", "SwiGLU clamp limit ignored", "prepare")
def _limit_ignored(ckpt: MoECheckpoint) -> MoECheckpoint:
    return _with_act(ckpt, limit=1e30) if ckpt.activation.limit is not None else ckpt


@_mutant("gelu_erf_as_tanh", "erf GELU computed with the tanh approximation", "prepare")
def _gelu_as_tanh(ckpt: MoECheckpoint) -> MoECheckpoint:
    f = ckpt.activation.formula
    return _with_act(ckpt, kind="GELU_TANH") if f == "GELU" else ckpt


@_mutant("situ_beta_lin_dropped", "SiTU's linear-branch tanh (beta_lin) dropped", "prepare")
def _situ_beta_lin_dropped(ckpt: MoECheckpoint) -> MoECheckpoint:
    return _with_act(ckpt, beta_lin=0.0) if ckpt.activation.formula == "SITU" else ckpt


@_mutant("bias_dropped", "expert biases dropped", "prepare")
def _bias_dropped(ckpt: MoECheckpoint) -> MoECheckpoint:
    return dataclasses.replace(ckpt, b13=None, b2=None)


# ---- forward-level bugs ---------------------------------------------------------------------------


@_mutant("a2_qdq_dropped", "the intermediate (a2) QDQ dropped", "forward")
def _skip_a2_qdq(base, prep, x, w, ids):
    # quantizes GEMM1's input as the scheme says, then runs the rest as if the scheme were A16
    aq = prep.scheme.act
    if aq is None:
        return base(prep, x, w, ids)
    a1_scale, _ = static_activation_scales(prep)
    a1 = activation_qdq(x.float(), aq, prep, a1_scale).to(torch.bfloat16)
    return base(_with_scheme_act(prep, None), a1, w, ids)


@_mutant("static_scale_applied_twice", "static input scale applied twice", "forward")
def _a1_qdq_twice_with_scale(base, prep, x, w, ids):
    # the static input scale applied twice: x / s quantized, then treated as x again
    aq = prep.scheme.act
    if aq is None or not aq.static:
        return base(prep, x, w, ids)
    a1_scale, _ = static_activation_scales(prep)
    return base(prep, (x.float() * a1_scale).to(torch.bfloat16), w, ids)


@_mutant("routing_weights_ignored", "routing weights ignored (uniform 1/k)", "forward")
def _routing_weights_ignored(base, prep, x, w, ids):
    return base(prep, x, torch.full_like(w, 1.0 / w.shape[1]), ids)


@_mutant("routing_weights_scaled", "renormalization / routed scaling factor mishandled (weights off by 10%)", "forward")
def _renormalize_dropped(base, prep, x, w, ids):
    # weights of the unnormalized softmax top-k: what a backend that re-derives them gets wrong
    return base(prep, x, w * 0.9, ids)


@_mutant("last_expert_dropped", "experts loop off by one: the highest expert's tokens get nothing", "forward")
def _last_expert_dropped(base, prep, x, w, ids):
    # an off-by-one over the experts that have tokens: the highest one is never computed
    if ids.numel() == 0:
        return base(prep, x, w, ids)
    top = int(ids.max())
    return base(prep, x, torch.where(ids == top, 0.0, w), ids)


@_mutant("padded_rows_leak", "padded rows' bias-only outputs leak into token 0", "forward")
def _padded_rows_leak(base, prep, x, w, ids):
    # padded rows (zero activations) are computed and their output (bias-only) lands on token 0
    out = base(prep, x, w, ids)
    if prep.b2 is None or out.shape[0] == 0:
        return out
    leak = prep.b2[int(ids[0, 0])].to(out.dtype)
    out = out.clone()
    out[0] += leak
    return out


@_mutant("situ_unsupported_on_gfx942", "SITU raises on gfx942 with no fallback", "forward")
def _situ_unsupported_on_gfx942(base, prep, x, w, ids):
    if prep.activation.formula == "SITU" and prep.fp8_format is E4M3FNUZ:
        raise NotImplementedError("SITU is not supported on gfx942")  # the AITER failure, no fallback
    return base(prep, x, w, ids)


@_mutant("fp8_bias_before_dequantization",
         "FP8 per-tensor bias added to the unscaled accumulator, then scaled (vLLM PR 31676)", "prepare")
def _fp8_bias_before_dequantization(ckpt: MoECheckpoint) -> MoECheckpoint:
    # vLLM's Triton fused MoE before PR 31676: with per-tensor FP8 the bias was added to the unscaled
    # accumulator, then multiplied by a_scale * w_scale; a backend reading the bias that way computes
    # with bias * a_scale * w_scale
    wq, aq = ckpt.scheme.weight, ckpt.scheme.act
    if wq is None or wq.kind is not FP8 or wq.granularity is not Granularity.PER_TENSOR or aq is None or not aq.static:
        return ckpt
    a1_scale, a2_scale = static_activation_scales(ckpt)
    scaled = lambda b, a_s, w: None if b is None else b * a_s * w.scale.reshape(-1, 1)  # noqa: E731
    return dataclasses.replace(ckpt, b13=scaled(ckpt.b13, a1_scale, ckpt.w13), b2=scaled(ckpt.b2, a2_scale, ckpt.w2))


@_mutant("router_weight_applied_twice",
         "router weight applied in the GEMM epilogue and again in the reduction", "forward")
def _router_weight_applied_twice(base, prep, x, w, ids):
    # in the GEMM epilogue and again in the top-k reduction: every term carries w^2
    return base(prep, x, w * w, ids)


@_mutant("fnuz_clamped_at_224", "FNUZ activations clamped at 224 where 240 is declared", "forward")
def _fnuz_max_224_fwd(base, prep, x, w, ids):
    if prep.fp8_format is not E4M3FNUZ or prep.scheme.act is None or prep.scheme.act.kind is not FP8:
        return base(prep, x, w, ids)
    a1_scale, _ = static_activation_scales(prep)
    if a1_scale is None:
        return base(prep, x, w, ids)
    clipped = torch.clamp(x.float(), -224 * float(a1_scale), 224 * float(a1_scale)).to(torch.bfloat16)
    return base(prep, clipped, w, ids)


# ---- quantizer entry-point bugs --------------------------------------------------------------------


@_mutant("mx_scale_log2_pitfall",
         "MX scale one binade off for amax just below a power of two (fp32 log2)", "quantize_mx")
def _mx_log2_pitfall(x, elem, scale_mode):
    q = quantize_mx(x, elem, scale_mode=scale_mode)
    if scale_mode is not ScaleMode.FLOOR:
        return tuple(q)
    amax = x.float().abs().reshape(*x.shape[:-1], -1, 32).amax(-1)
    e = torch.floor(torch.log2(amax.clamp_min(2.0**-126))).int() - elem.emax
    scales = torch.where(amax > 0, (e.clamp(-127, 127) + 127), 0).to(torch.uint8)
    codes = quantize_mx(x, elem).codes
    shift = (scales.int() - 127).repeat_interleave(32, -1)
    codes = torch.where(scales.repeat_interleave(32, -1) != q.scales.repeat_interleave(32, -1),
                        encode(x.float(), elem, exp_shift=shift), codes)
    return codes, scales


@_mutant("rceil_where_floor_declared", "RCEIL scales where FLOOR is declared", "quantize_mx")
def _mx_rceil_for_floor(x, elem, scale_mode):
    return tuple(quantize_mx(x, elem, scale_mode=ScaleMode.RCEIL))


# ---- shape-only bugs: invisible at the suite's default shapes (H = I = 128, <= 8 experts, top_k <= 4, <= 10
# contiguous tokens with int64 ids); shape classes catch them (hunt_shapes) --------------------------------------

_K_TILE = 128


@_mutant("k_tail_dropped", "K loop over whole 128-wide tiles only: the hidden size's tail is never read", "forward",
         shape_only=True)
def _k_tail_dropped(base, prep, x, w, ids):
    whole = x.shape[1] // _K_TILE * _K_TILE
    if whole == x.shape[1]:
        return base(prep, x, w, ids)
    x = x.clone()
    x[:, whole:] = 0
    return base(prep, x, w, ids)


@_mutant("expert_ids_as_uint8", "expert ids narrowed to 8 bits: experts 256 and up alias 0 and up", "forward",
         shape_only=True)
def _expert_ids_as_uint8(base, prep, x, w, ids):
    return base(prep, x, w, ids.to(torch.uint8).to(ids.dtype))


@_mutant("top_k_capped_at_8", "kernel specialised for top_k <= 8: the 9th and later experts are dropped", "forward",
         shape_only=True)
def _top_k_capped_at_8(base, prep, x, w, ids):
    if ids.shape[1] <= 8:
        return base(prep, x, w, ids)
    return base(prep, x, torch.cat([w[:, :8], torch.zeros_like(w[:, 8:])], 1), ids)


@_mutant("tokens_past_256_dropped", "grid sized for one 256-token chunk: later tokens are never computed", "forward",
         shape_only=True)
def _tokens_past_256_dropped(base, prep, x, w, ids):
    out = base(prep, x, w, ids)
    out[256:] = 0
    return out


@_mutant("hidden_states_strides_ignored", "hidden_states read as if contiguous (row stride = H, offset kept)",
         "forward", shape_only=True)
def _strides_ignored(base, prep, x, w, ids):
    rows = torch.as_strided(x, x.shape, (x.shape[1], 1), x.storage_offset())
    return base(prep, torch.nan_to_num(rows), w, ids)  # the kernel reads whatever lies there


@_mutant("int32_ids_read_as_int64", "int32 topk_ids read with an int64 pointer: pairs of ids fuse", "forward",
         shape_only=True)
def _int32_ids_as_int64(base, prep, x, w, ids):
    if ids.dtype != torch.int32:
        return base(prep, x, w, ids)
    fused = ids.contiguous().view(torch.int64) % prep.num_experts  # what the wrong loads index with
    return base(prep, x, w[:, : fused.shape[1]], fused)


MUTANTS: tuple[Mutant, ...] = (
    *(m for m in _REGISTERED if not m.shape_only),
    Mutant("structure_not_as_declared", "computes another numerical structure than the one it declares",
           structure_computed=True),
)


SHAPE_MUTANTS: tuple[Mutant, ...] = tuple(m for m in _REGISTERED if m.shape_only)

# The correct base with no bug: the catalog run requires it to pass, so that a caught mutant is caught
# for its bug and not for something the base gets wrong.
CONTROL = Mutant("control", "no bug: the correct base every mutant wraps")


class _MutantBackend(TorchEmulationBackend):
    # The correct base: torch emulation with fp32 GEMM operands, so that the derived bound is the tight
    # one (with bf16 operands it must allow 2^-8 per FP8/NVFP4 operand, which hides e.g. the 224 clamp),
    # computing and declaring `structure` (the catalog is rebased on every structure).
    operand_dtype = torch.float32

    def __init__(self, mutant: Mutant, structure: NumericalStructure = DEFAULT_STRUCTURE):
        self.mutant = mutant
        self.numerical_structure = structure
        self.computed_structure = _another_structure(structure) if mutant.structure_computed else structure
        self.name = f"mutant_{mutant.name}" + ("" if structure == DEFAULT_STRUCTURE else f"@{structure.name}")
        if mutant.quantize_mx is not None:
            self.quantize_mx = mutant.quantize_mx

    def prepare(self, ckpt):
        return self.mutant.prepare(ckpt) if self.mutant.prepare else ckpt

    def forward(self, prepared, hidden_states, topk_weights, topk_ids):
        def base(ckpt, x, w, ids):
            # the routed experts only: the same values as dequantizing all of them, at a real model's expert count
            return moe_emulation(x, ckpt, w, ids, structure=self.computed_structure, operand_dtype=torch.float32)

        if self.mutant.forward:
            return self.mutant.forward(base, prepared, hidden_states, topk_weights, topk_ids)
        return base(prepared, hidden_states, topk_weights, topk_ids)


def _another_structure(declared: NumericalStructure) -> NumericalStructure:
    """The next structure in STRUCTURES that is defined for the declared one's top-k."""
    names = list(STRUCTURES)
    for step in range(1, len(names)):
        other = STRUCTURES[names[(names.index(declared.name) + step) % len(names)]]
        if declared.max_top_k is not None or other.max_top_k is None:
            return other
    raise AssertionError("STRUCTURES has one entry")


def make_mutant(name: str, structure: NumericalStructure | str = DEFAULT_STRUCTURE):
    """The mutant backend `name`, declaring `structure` (pytest --backend harness.detection.catalog:mutant_<name>
    loads it with the default structure)."""
    by_name = {m.name: m for m in (*MUTANTS, *SHAPE_MUTANTS, CONTROL)}
    if name not in by_name:
        raise ValueError(f"unknown mutant {name!r}; expected one of {sorted(by_name)}")
    return _MutantBackend(by_name[name], structure_by_name(structure))


def __getattr__(attr: str):
    # `harness.detection.catalog:mutant_<name>` is a backend factory for every mutant
    if attr.startswith("mutant_"):
        return lambda: make_mutant(attr.removeprefix("mutant_"))
    raise AttributeError(attr)



# cpu: the host semantics on the CI machine; gfx942: the FNUZ semantics (FP8 dtype bugs show only there)
CATALOG_PLATFORMS = ("cpu", "gfx942")


@dataclass(frozen=True)
class Catch:
    check: str  # "quantizer entry points" or the conformance case id
    message: str
    seconds: float  # from the start of the hunt to the catch
    checks_run: int


def hunt(backend, platforms=CATALOG_PLATFORMS) -> tuple[Catch | None, float, int]:
    """Run the conformance checks on `backend` until one fails: (the catch or None, seconds, checks run).
    None means the backend passed every check: right for the control, a survivor for a mutant."""
    t0, n = time.perf_counter(), 0
    if quantizer_cases(backend):
        n += 1
        # the suite's settings under the ci profile: derandomized, no database
        ci = settings(max_examples=30, derandomize=True, database=None, deadline=None, print_blob=False)
        try:
            quantizer_property(backend, ci)()
        except AssertionError as exc:
            return Catch("quantizer entry points", str(exc).splitlines()[0], time.perf_counter() - t0, n), \
                time.perf_counter() - t0, n
    # the cpu host's case set on every machine: a GPU host would otherwise skip the simulated cpu cases
    for case, reason in conformance_cases({backend.name: backend}, [PLATFORMS[p] for p in platforms],
                                          host=PLATFORMS["cpu"]):
        if reason:
            continue
        n += 1
        try:
            result = run_case(backend, case, SHAPES["cpu"], diagnose=False)
            ok, message = result.ok, result.message()
        except Declined:  # the suite reports a declined checkpoint as a skip
            continue
        except Exception as exc:  # a crash on valid input is caught too: the suite reports it as an error
            ok, message = False, f"{type(exc).__name__}: {exc}"
        if not ok:
            return Catch(case.id, message, time.perf_counter() - t0, n), time.perf_counter() - t0, n
    return None, time.perf_counter() - t0, n


def hunt_shapes(backend, platform: str = "cpu") -> tuple[Catch | None, float, int]:
    """The shape classes (harness.inputs.shape_classes), every scheme family, until one fails: as hunt()."""
    t0, n = time.perf_counter(), 0
    for shape_class in SHAPE_CLASSES.values():
        for scheme in SHAPE_CLASS_SCHEMES:
            try:
                result = run_shape_class_case(backend, scheme, shape_class, PLATFORMS[platform], diagnose=False)
            except Exception as exc:  # noqa: BLE001 - a crash on valid input is a failure, as in the suite
                result = None
                ok, message = False, f"{type(exc).__name__}: {exc}"
            if isinstance(result, str):
                continue
            n += 1
            if result is not None:
                ok, message = result.ok, result.message()
            if not ok:
                return Catch(f"shape class {shape_class.name} ({scheme})", message, time.perf_counter() - t0, n), \
                    time.perf_counter() - t0, n
    return None, time.perf_counter() - t0, n
