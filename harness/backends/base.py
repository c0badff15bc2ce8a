"""The backend protocol: the public plugin surface (documented in README, "Write a backend").

A backend is any object with:
  name: str
  supports(problem, platform) -> (ok: bool, reason: str)   can it compute this problem with that
                                                           platform's semantics? (the oracle asks this)
  prepare(ckpt) -> prepared                                checkpoint layout in, the backend's layout out;
                                                           may raise NotImplementedError for a checkpoint it
                                                           cannot compute exactly (the message says why:
                                                           reported as a skip, never a wrong answer)
  forward(prepared, hidden_states, topk_weights, topk_ids) -> bf16 [T, H]
Optional:
  available(platform) -> (ok, reason)   can it run here, now (device, packages)? default: yes
  operand_dtype: torch.dtype            float32 (default) or bfloat16 if it rounds dequantized GEMM
                                        operands to bf16; the derived bound depends on it. A dict {scheme name:
                                        dtype} declares it per scheme (float32 for the schemes it omits)
  accumulation_error: float             0 (default) for fp32 GEMM accumulation; else the extra error of its
                                        hardware accumulator relative to sum|a||w| (see torch_fp8); a dict
                                        {scheme name: error} declares it per scheme (0 for the schemes it omits)
  accumulation_truncation: float        0 (default) for a round-to-nearest accumulator; else the fraction of the
                                        running sum its accumulator may lose toward zero at each 16-wide K step
                                        (Hopper's bf16 matrix units: harness.platforms.Platform.mma_truncation);
                                        systematic, so in full, times the largest partial sum; a dict per scheme
  k_order: str                          "ordered" (default): each GEMM output's partial sums cover contiguous K
                                        ranges (tiled K loops, split-K reduced in K order); "any": it combines
                                        K partial sums out of order (split-K by atomics, K-permuted layouts).
                                        The bound's rounding terms scale with the partial sums it allows
                                        (harness.core.tolerances.gemm_magnitudes)
  intermediate_multiple: int            a rank's share of I under tensor parallelism is padded (with zero
                                        weights) to a multiple of this (default 1; torch's FP8 GEMMs: 16)
  device_bytes(problem) -> int          device memory it allocates beyond the checkpoint's copies (workspaces,
                                        a compiler's autotuning scratch) at this problem; the real-model-shape
                                        cases add it to a case's estimate and skip, with the figures, a case
                                        that would not fit (default 0)
  known_failures: tuple[KnownFailure, ...]
                                        special-value cases it is known to get wrong (run as strict xfails);
                                        its prepare() may decline them while decline_known_failures is set
  numerical_structure: NumericalStructure | str
                                        where it rounds and in what dtype, where it applies the router
                                        weight, how it evaluates the activation and sums the top-k terms
                                        (reference.structure; a name from STRUCTURES or a record). Default:
                                        vLLM's Triton fused MoE ("vllm_triton")
  quantize_mx(x, elem, scale_mode) -> (codes, scales)              quantizer entry points, checked
  quantize_nvfp4(x, global_decode_scale) -> (codes, block_scales)  bit-exactly against the reference
  quantize_fp8(x, fmt, granularity, block_shape, scale) -> (codes, scale)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from reference.activations import Activation
from reference.checkpoints import MoECheckpoint
from reference.schemes import Scheme
from reference.structure import DEFAULT_STRUCTURE, NumericalStructure, structure_by_name

__all__ = ["Problem", "Backend", "backend_operand_dtype", "backend_accumulation_error", "backend_k_order",
           "backend_accumulation_truncation",
           "backend_bound_declarations", "backend_available",
           "backend_intermediate_multiple", "backend_device_bytes",
           "backend_structure", "backend_prepare", "Declined", "checked_supports", "KnownFailure",
           "backend_known_failures", "known_failure_for"]


@dataclass(frozen=True)
class Problem:
    """What a backend is asked to compute: the shapes, top-k, token count and biases of the case that will
    actually run (a backend may support only some)."""

    scheme: Scheme
    activation: Activation
    num_experts: int = 8
    hidden_size: int = 256
    intermediate_size: int = 256
    tokens: int = 16
    top_k: int = 2
    has_bias: bool = False

    @property
    def label(self) -> str:
        return f"{self.scheme.name}/{self.activation.name}"


@runtime_checkable
class Backend(Protocol):
    name: str

    def supports(self, problem: Problem, platform: Any) -> tuple[bool, str]: ...

    def prepare(self, ckpt: MoECheckpoint) -> Any: ...

    def forward(self, prepared: Any, hidden_states: torch.Tensor, topk_weights: torch.Tensor,
                topk_ids: torch.Tensor) -> torch.Tensor: ...


def checked_supports(backend, problem: Problem, platform: Platform) -> tuple[bool, str]:
    """backend.supports(), with its answer checked: (bool, str), nothing else (a bool alone, None, or a
    2-character string such as "no" would otherwise read as an answer)."""
    answer = backend.supports(problem, platform)
    if not (isinstance(answer, tuple) and len(answer) == 2 and isinstance(answer[0], bool)
            and isinstance(answer[1], str)):
        raise TypeError(f"backend {backend.name!r}: supports() must return (bool, str), got {answer!r}")
    return answer


def backend_operand_dtype(backend, scheme: str | None = None) -> torch.dtype:
    """What the backend feeds its GEMMs for this scheme (see operand_dtype above); without a scheme, the widest
    declaration (what `python -m harness backends` prints)."""
    declared = getattr(backend, "operand_dtype", torch.float32)
    if not isinstance(declared, dict):
        return declared
    if scheme is None:
        return torch.bfloat16 if torch.bfloat16 in declared.values() else torch.float32
    return declared.get(scheme, torch.float32)


def _per_scheme(backend, attribute: str, scheme: str | None) -> float:
    """A float declaration that may be a dict by scheme name (0 for the schemes it omits); without a scheme, the
    largest it declares."""
    declared = getattr(backend, attribute, 0.0)
    if not isinstance(declared, dict):
        return declared
    return declared.get(scheme, 0.0) if scheme is not None else max(declared.values(), default=0.0)


def backend_accumulation_error(backend, scheme: str | None = None) -> float:
    """The backend's declared accumulation error for this scheme (see accumulation_error above)."""
    return _per_scheme(backend, "accumulation_error", scheme)


def backend_accumulation_truncation(backend, scheme: str | None = None) -> float:
    """The backend's declared accumulator truncation per K step for this scheme (see accumulation_truncation)."""
    return _per_scheme(backend, "accumulation_truncation", scheme)


# the K orders a backend may declare (k_order above; harness.core.tolerances.gemm_magnitudes bounds their partial sums)
K_ORDERS = ("ordered", "any")


def backend_k_order(backend) -> str:
    """The backend's declared K order (see k_order above)."""
    k_order = getattr(backend, "k_order", "ordered")
    if k_order not in K_ORDERS:
        raise TypeError(f"backend {backend.name!r}: k_order must be one of {K_ORDERS}, got {k_order!r}")
    return k_order


def backend_bound_declarations(backend, scheme: str) -> dict:
    """What the backend declares about its GEMMs for this scheme, as moe_error_bound's keyword arguments."""
    return dict(operand_dtype=backend_operand_dtype(backend, scheme),
                accumulation_error=backend_accumulation_error(backend, scheme),
                accumulation_truncation=backend_accumulation_truncation(backend, scheme), k_order=backend_k_order(backend))


def backend_intermediate_multiple(backend) -> int:
    m = getattr(backend, "intermediate_multiple", 1)
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise TypeError(f"backend {backend.name!r}: intermediate_multiple must be a positive int, got {m!r}")
    return m


def backend_device_bytes(backend, problem: Problem) -> int:
    """The backend's declared device memory beyond the checkpoint's copies (see device_bytes above)."""
    fn = getattr(backend, "device_bytes", None)
    if fn is None:
        return 0
    n = fn(problem)
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise TypeError(f"backend {backend.name!r}: device_bytes() must return a non-negative int, got {n!r}")
    return n


def backend_available(backend, platform) -> tuple[bool, str]:
    fn = getattr(backend, "available", None)
    if fn is None:
        return True, ""
    answer = fn(platform)
    if not (isinstance(answer, tuple) and len(answer) == 2 and isinstance(answer[0], bool)
            and isinstance(answer[1], str)):
        raise TypeError(f"backend {backend.name!r}: available() must return (bool, str), got {answer!r}")
    return answer


@dataclass(frozen=True)
class KnownFailure:
    """Cases a backend is known to get wrong, as data: the suites run them and expect the failure (strict: a
    pass means the upstream bug is fixed and the record must go). Either one special-value case
    (harness.inputs.special_values), run with the backend's guard off, or every conformance and special-value
    case of `schemes`, with biases (biased=True), without (False) or both (None)."""

    special: str | None  # SpecialCase.name; None: every case of `schemes`
    reason: str
    upstream: str  # where it is tracked or what fixes it
    schemes: tuple[str, ...] = ()
    biased: bool | None = None

    def __post_init__(self):
        if self.special is None and not self.schemes:
            raise ValueError("KnownFailure: name a special-value case or the schemes whose cases fail")

    def covers(self, scheme: str, has_bias: bool, special: str | None = None) -> bool:
        if self.special is not None:
            return special == self.special
        return scheme in self.schemes and (self.biased is None or self.biased == has_bias)


def backend_known_failures(backend) -> dict[str, KnownFailure]:
    """The special-value records, by special case name."""
    return {k.special: k for k in getattr(backend, "known_failures", ()) if k.special is not None}


def known_failure_for(backend, scheme: str, has_bias: bool, special: str | None = None) -> KnownFailure | None:
    """The record that declares this case a known failure, if any."""
    return next((k for k in getattr(backend, "known_failures", ()) if k.covers(scheme, has_bias, special)), None)


class Declined(Exception):
    """prepare() raised NotImplementedError for this checkpoint: a declared limitation, reported as a skip
    with the backend's reason (never a wrong answer). NotImplementedError from forward() is not this: a
    backend that claims a problem in supports() must compute it."""


def backend_prepare(backend, ckpt: MoECheckpoint):
    try:
        return backend.prepare(ckpt)
    except NotImplementedError as exc:
        raise Declined(f"{backend.name} declined the checkpoint: {exc}") from exc


def backend_structure(backend) -> NumericalStructure:
    """The backend's declared numerical structure (vLLM's Triton fused MoE when it declares none)."""
    declared = getattr(backend, "numerical_structure", DEFAULT_STRUCTURE)
    try:
        return structure_by_name(declared)
    except ValueError as exc:
        raise ValueError(f"backend {getattr(backend, 'name', backend)!r}: numerical_structure: {exc}") from None
