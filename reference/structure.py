"""The numerical structure of a fused-MoE kernel: where it rounds and in what dtype, where it applies the
router weight, how it evaluates the activation, how it sums the top-k terms, how it applies a static FP8
activation scale. Correct kernels differ in every one of these (see NUMERICS.md, "Where real MoE kernels
round"), and a difference of structure moves outputs by about one bf16 ulp on a tenth of the elements:
more than a tight bound allows. So the structure is declared by the backend, the reference MoE computes
with it, and the derived bound follows it (harness.core.tolerances.moe_error_bound).

Per (token t, expert e, router weight w) pair, with rnd_P the rounding to precision P:
  h = rnd_gemm1(W13 a1 + b13)            [GEMM1_EPILOGUE: rnd_gemm1(w * (W13 a1 + b13))]
  y = rnd_act(phi(g) psi(u))             [GATE_ROUNDED:   rnd_act(rnd_act(phi(g)) psi(u)); per activation]
  z = rnd_gemm2(W2 Qa(y) + b2)           [GEMM2_EPILOGUE: rnd_gemm2(w * (W2 Qa(y) + b2))]
  term = w z                             [the weight already applied: term = z]
  out = bf16(sum_k term)  in fp32        [SEQUENTIAL: acc = rnd_gemm2(acc + term_j), j = 0..k-1, in order;
                                          MOE_SUM: SEQUENTIAL for top_k <= 4, the fp32 sum above that]

How the activation is evaluated is a property of each activation's kernel, not of the whole MoE: vLLM's
act_and_mul family rounds the gate function first, its swigluoai/situ/swiglustep kernels round once. A
structure states a default and per-activation rules (ActivationRule), each naming the source it was read
from.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from .activations import ACTIVATIONS
from .fp8 import ScaleApply

__all__ = [
    "Precision", "RouterWeight", "ActivationEval", "ActivationRule", "TopKSum", "NumericalStructure", "STRUCTURES",
    "DEFAULT_STRUCTURE", "structure_by_name", "round_to", "VLLM_ACTIVATION_RULES",
]


class Precision(enum.Enum):
    """The dtype a kernel stores an intermediate in (fp32: kept in the accumulator's precision)."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"

    @property
    def dtype(self) -> torch.dtype:
        return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[self.value]

    @property
    def unit_roundoff(self) -> float:
        return {"bf16": 2.0**-8, "fp16": 2.0**-11, "fp32": 2.0**-24}[self.value]


class RouterWeight(enum.Enum):
    """Where the router weight multiplies a pair's value."""

    AFTER_GEMM2_ROUNDING = "after_gemm2_rounding"  # w * rnd(z) inside the top-k sum (a separate reduce kernel)
    GEMM2_EPILOGUE = "gemm2_epilogue"  # rnd(w * z): into GEMM2's fp32 accumulator (vLLM MUL_ROUTED_WEIGHT)
    # into GEMM1's fp32 accumulator, bias included, before its rounding; GEMM2 does not apply it (vLLM's
    # apply_router_weight_on_input, a different model, defined for top_k = 1 only)
    GEMM1_EPILOGUE = "gemm1_epilogue"


class ActivationEval(enum.Enum):
    FP32 = "fp32"  # phi(g) psi(u) evaluated in fp32, rounded once to the act_out precision
    GATE_ROUNDED = "gate_rounded"  # phi(g) rounded to the act_out precision first (vLLM's CUDA act_and_mul)


@dataclass(frozen=True)
class ActivationRule:
    """How a kernel evaluates one activation (by Activation.name), and where that was read."""

    activation: str
    evaluation: ActivationEval
    source: str  # the file and function the rule was read from (or why there is none)

    def __post_init__(self):
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"ActivationRule.activation must be one of {sorted(ACTIVATIONS)}, got {self.activation!r}")
        if not isinstance(self.evaluation, ActivationEval):
            raise TypeError(f"ActivationRule.evaluation must be an ActivationEval, got {self.evaluation!r}")
        if not isinstance(self.source, str) or not self.source.strip():
            raise ValueError(f"ActivationRule({self.activation!r}).source must name where the rule was read")


class TopKSum(enum.Enum):
    FP32 = "fp32"  # the k terms summed in fp32, any order, one rounding to the bf16 output
    # acc = term_0, then acc = rnd(acc + term_j) for j = 1..k-1 in top-k order, in the gemm2_out precision
    SEQUENTIAL = "sequential"
    # vLLM's moe_sum (csrc/moe/moe_align_sum_kernels.cu): top_k 2, 3 and 4 run moe_sum_kernel<scalar_t, TOPK>,
    # a sequential sum in the output dtype; any other top_k runs at::sum_out, which accumulates bf16 in fp32
    # and rounds once
    MOE_SUM = "moe_sum"

    def for_top_k(self, top_k: int) -> "TopKSum":
        """The plain rule (FP32 or SEQUENTIAL) this one follows at `top_k`."""
        if self is TopKSum.MOE_SUM:
            return TopKSum.SEQUENTIAL if 2 <= top_k <= 4 else TopKSum.FP32
        return self


@dataclass(frozen=True)
class NumericalStructure:
    name: str
    gemm1_out: Precision = Precision.BF16
    act_out: Precision = Precision.BF16
    gemm2_out: Precision = Precision.BF16
    router_weight: RouterWeight = RouterWeight.GEMM2_EPILOGUE
    activation: ActivationEval = ActivationEval.GATE_ROUNDED
    topk_sum: TopKSum = TopKSum.SEQUENTIAL
    fp8_static_scale: ScaleApply = ScaleApply.RECIPROCAL_MULTIPLY  # how a static FP8 activation scale is applied
    description: str = ""
    activation_rules: tuple[ActivationRule, ...] = ()  # per activation; `activation` is the rest's rule

    def __post_init__(self):
        for field, kind in (("gemm1_out", Precision), ("act_out", Precision), ("gemm2_out", Precision),
                            ("router_weight", RouterWeight), ("activation", ActivationEval),
                            ("topk_sum", TopKSum), ("fp8_static_scale", ScaleApply)):
            value = getattr(self, field)
            if not isinstance(value, kind):
                raise TypeError(f"NumericalStructure.{field} must be a {kind.__name__} "
                                f"(one of {[m.name for m in kind]}), got {value!r}")
        if not isinstance(self.activation_rules, tuple) or not all(
                isinstance(r, ActivationRule) for r in self.activation_rules):
            raise TypeError(f"NumericalStructure.activation_rules must be a tuple of ActivationRule, "
                            f"got {self.activation_rules!r}")
        names = [r.activation for r in self.activation_rules]
        if len(set(names)) != len(names):
            raise ValueError(f"NumericalStructure.activation_rules names an activation twice: {names}")

    def activation_eval(self, act) -> ActivationEval:
        """How this structure evaluates `act` (an Activation): its rule if it has one, else the default."""
        for rule in self.activation_rules:
            if rule.activation == act.name:
                return rule.evaluation
        return self.activation

    @property
    def max_top_k(self) -> int | None:
        """The largest top_k this structure is defined for (None: any)."""
        return 1 if self.router_weight is RouterWeight.GEMM1_EPILOGUE else None

    def check_top_k(self, top_k: int) -> None:
        if self.max_top_k is not None and top_k > self.max_top_k:
            raise ValueError(f"structure {self.name!r} applies the router weight in GEMM1's epilogue, which is "
                             f"defined for top_k <= {self.max_top_k} only; got top_k={top_k}")

    @property
    def label(self) -> str:
        groups: dict[ActivationEval, list[str]] = {}
        for r in self.activation_rules:
            groups.setdefault(r.evaluation, []).append(r.activation)
        if groups:  # name the activations of the smaller groups; the largest is "the rest"
            rest = max(groups, key=lambda e: len(groups[e]))
            per_act = "; ".join(f"{e.value}: {', '.join(groups[e])}" for e in groups if e is not rest)
            act = f"per activation: {per_act}; {rest.value}: the rest"
        else:
            act = self.activation.value
        return (f"{self.name}: gemm1->{self.gemm1_out.value}, act({act})->"
                f"{self.act_out.value}, gemm2->{self.gemm2_out.value}, router weight {self.router_weight.value}, "
                f"top-k sum {self.topk_sum.value}, static FP8 scale {self.fp8_static_scale.name.lower()}")


def round_to(x: torch.Tensor, precision: Precision, enabled: bool = True) -> torch.Tensor:
    """float64 -> `precision` -> float64 the way a kernel rounds: to fp32 (its accumulator), then to the
    storage dtype, both RNE. fp32 storage rounds once. Values past the dtype's range become +-inf."""
    if not enabled:
        return x
    return x.float().to(precision.dtype).double()


_ACT_AND_MUL = ("activation_kernels.cu act_and_mul_kernel / compute(): ACT_FN returns the storage type, so the gate "
                "function is rounded to bf16 before the multiply by the up half (the packed bf16x2 path likewise)")
_ONE_ROUNDING = "evaluated in fp32 and rounded once to the storage type"
# vLLM 0.33.0's fused MoE activations, as fused_moe/activation.py apply_moe_activation dispatches them
VLLM_ACTIVATION_RULES = (
    ActivationRule("SILU", ActivationEval.GATE_ROUNDED,
                   f"silu_and_mul (silu_and_mul_with_clamp with a limit), {_ACT_AND_MUL}"),
    ActivationRule("GELU", ActivationEval.GATE_ROUNDED, f"gelu_and_mul, {_ACT_AND_MUL}"),
    ActivationRule("GELU_TANH", ActivationEval.GATE_ROUNDED, f"gelu_tanh_and_mul, {_ACT_AND_MUL}"),
    ActivationRule("SWIGLUOAI", ActivationEval.FP32,
                   f"activation_kernels.cu swigluoai_and_mul: (u + 1) g / (1 + exp(-alpha g)) {_ONE_ROUNDING}"),
    ActivationRule("SITU", ActivationEval.FP32,
                   f"activation_kernels.cu situ_and_mul_kernel: beta tanh(g/beta) sigmoid(g) U {_ONE_ROUNDING}"),
    ActivationRule("SWIGLUSTEP", ActivationEval.FP32,
                   f"model_executor/layers/activation.py _swiglustep_and_mul_kernel (Triton): {_ONE_ROUNDING}"),
    ActivationRule("RELU2", ActivationEval.FP32,
                   "none: apply_moe_activation has no gated RELU2 (it raises 'Unsupported FusedMoe activation'); "
                   "a backend that follows vLLM declines it"),
    ActivationRule("SILU_NO_MUL", ActivationEval.FP32, "apply_moe_activation: F.silu on the bf16 cache, one rounding"),
    ActivationRule("GELU_NO_MUL", ActivationEval.FP32, "apply_moe_activation: F.gelu on the bf16 cache, one rounding"),
    ActivationRule("GELU_TANH_NO_MUL", ActivationEval.FP32,
                   "apply_moe_activation: F.gelu(approximate='tanh') on the bf16 cache, one rounding"),
    ActivationRule("RELU2_NO_MUL", ActivationEval.FP32,
                   "apply_moe_activation: F.relu then torch.square on bf16 (relu is exact), one rounding"),
    ActivationRule("SITU_NO_MUL", ActivationEval.FP32,
                   "none: MoEActivation has no situ_no_mul; a backend that follows vLLM declines it"),
)
VLLM_TRITON = NumericalStructure(
    "vllm_triton",
    topk_sum=TopKSum.MOE_SUM,
    activation_rules=VLLM_ACTIVATION_RULES,
    description="vLLM's Triton fused MoE (fused_moe.py fused_experts_impl): bf16 caches after each GEMM and the "
                "activation, the activation evaluated as its kernel does (act_and_mul rounds the gate function "
                "first; swigluoai, situ and swiglustep round once), the router weight in GEMM2's fp32 epilogue, "
                "moe_sum (bf16 in top-k order for top_k 2-4, fp32 otherwise), static FP8 scales applied as "
                "x * fl(1/scale) (scaled_fp8_quant)",
)
STRUCTURES: dict[str, NumericalStructure] = {
    s.name: s
    for s in (
        VLLM_TRITON,
        NumericalStructure(
            "vllm_triton_weight_on_input", router_weight=RouterWeight.GEMM1_EPILOGUE, topk_sum=TopKSum.MOE_SUM,
            activation_rules=VLLM_ACTIVATION_RULES,
            description="vLLM's Triton fused MoE with apply_router_weight_on_input (top_k = 1): the weight "
                        "multiplies GEMM1's fp32 output, GEMM2 is unweighted"),
        NumericalStructure(
            "rounded_terms", router_weight=RouterWeight.AFTER_GEMM2_ROUNDING, activation=ActivationEval.FP32,
            topk_sum=TopKSum.FP32, fp8_static_scale=ScaleApply.DIVIDE,
            description="bf16 GEMM outputs and activation (fp32-evaluated, rounded once); the top-k reduction "
                        "weights the rounded terms and sums them in fp32 (this project's Triton kernels)"),
        NumericalStructure(
            "fp32_reduce", gemm2_out=Precision.FP32, topk_sum=TopKSum.FP32, activation=ActivationEval.FP32,
            fp8_static_scale=ScaleApply.DIVIDE,
            description="finalize-epilogue kernels (CUTLASS grouped GEMMs with a fused finalize): GEMM2 outputs "
                        "weighted in fp32 and summed in fp32, one bf16 rounding at the output"),
        NumericalStructure(
            "triton_kernels_ogs", gemm1_out=Precision.FP32, activation=ActivationEval.FP32,
            topk_sum=TopKSum.FP32, fp8_static_scale=ScaleApply.DIVIDE,
            description="OpenAI's triton_kernels matmul_ogs as vLLM runs it (vllm/third_party/triton_kernels "
                        "0.33.0): the activation fused into GEMM1's epilogue on the fp32 accumulator "
                        "(_matmul_ogs: acc + bias, then ACTIVATION_FN, swiglu_fn: one fp32 evaluation), rounded "
                        "once to bf16; GEMM2's fp32 accumulator + bias times the router weight (gammas) rounded "
                        "to bf16 per pair (the scratchpad has the output dtype when split_k = 1, as vLLM pins "
                        "on sm90), then reduce_grouped sums the top-k rows in fp32 and rounds once"),
    )
}
# A backend that declares nothing is judged as vLLM's Triton fused MoE, the system the seeds come from.
DEFAULT_STRUCTURE = VLLM_TRITON


def structure_by_name(name: str | NumericalStructure) -> NumericalStructure:
    if isinstance(name, NumericalStructure):
        return name
    try:
        return STRUCTURES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown numerical structure {name!r}; expected one of {sorted(STRUCTURES)} "
                         "or a NumericalStructure") from None
