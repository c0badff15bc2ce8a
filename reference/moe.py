"""The reference fused MoE: the value a checkpoint means, computed with a kernel's numerical structure.

For each token t and each of its top-k experts e (router weight w), with the structure's rounding points
(reference.structure: where the kernel rounds, where it applies w, how it sums the top-k terms):
  a1 = Qa(x_t)                        activation quantization of the GEMM1 input (none for A16 schemes)
  h  = rnd(W13_e a1 + b13_e)          the gemm1_out rounding point (w inside it: GEMM1_EPILOGUE)
  y  = rnd(act(h))   (fp32)           the act_out rounding point (the gate function too: GATE_ROUNDED)
  a2 = Qa(y)                          activation quantization of the GEMM2 input (none for A16 schemes)
  z  = rnd(W2_e a2 + b2_e)            the gemm2_out rounding point (w inside it: GEMM2_EPILOGUE)
  out_t = bf16(sum_k w z)             fp32 sum, or a sequential sum rounded after every add (SEQUENTIAL)
GEMMs accumulate in float64 here (the exact sum, up to 1e-16), weights are the checkpoint's dequantized
values (reference.checkpoints.dequantize_weight). Static activation scales are the max over experts of
the checkpoint's input scales (NVFP4: one a1 and one a2 global scale shared by all experts).
`exact=True` drops every rounding point and computes the activation in float64: the mathematical
meaning under the same structure (activation quantizers then see the fp32 rounding of their input).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .activations import gate_and_up
from .checkpoints import MoECheckpoint, check_checkpoint, dequantize_weight
from .fp8 import ScaleApply
from .schemes import ActQuant
from .structure import (DEFAULT_STRUCTURE, ActivationEval, NumericalStructure, Precision, RouterWeight, TopKSum,
                        round_to, structure_by_name)

__all__ = ["MoETrace", "fused_moe", "round_bf16", "activation_qdq", "static_activation_scales", "check_moe_inputs",
           "evaluate_activation", "RoutedWeights", "routed_weights", "EAGER_WEIGHT_BYTES"]

# Routed experts' float64 weights up to this size are dequantized at once (one call: the CPU suites' thousands of
# small cases); beyond it, one expert at a time (a real model's routed experts in float64: Kimi-K2 at 64 tokens
# ~300 experts x 44M weights = 100 GB). Dequantization is per block, so both give the same values bit for bit.
EAGER_WEIGHT_BYTES = 2**30


class RoutedWeights:
    """The routed experts' dequantized float64 weights, [R, N, K] as indexing sees them ([i] is experts[i]'s
    [N, K], also [i, n]), dequantized when indexed and only the last expert kept: the reference and its bound
    walk the experts in order, so each expert is dequantized once per walk and one is in memory at a time."""

    def __init__(self, weight, experts: torch.Tensor, ckpt: MoECheckpoint):
        self._weight, self._experts, self._ckpt = weight, experts, ckpt
        self._last: tuple[int, torch.Tensor] | None = None
        self.shape = torch.Size((len(experts), *self[0].shape))

    def __len__(self) -> int:
        return len(self._experts)

    def __getitem__(self, index):
        if isinstance(index, tuple):
            return self[index[0]][index[1:]]
        i = int(index) + (len(self) if int(index) < 0 else 0)
        if self._last is None or self._last[0] != i:
            one = self._weight.experts(self._experts[i:i + 1])
            self._last = (i, dequantize_weight(one, self._ckpt.scheme.weight, self._ckpt).double()[0])
        return self._last[1]

    def exactly_bf16(self) -> bool:
        """Every expert's values are bf16 values (decides whether a kernel may round them as GEMM operands)."""
        return all(bool((self[i].to(torch.bfloat16).double() == self[i]).all()) for i in range(len(self)))


def routed_weights(experts: torch.Tensor, ckpt: MoECheckpoint):
    """The routed experts' dequantized float64 w13 and w2 ([E, N, K] logically): tensors [R, N, K] while both
    together take up to EAGER_WEIGHT_BYTES, else RoutedWeights for both (the same values, one expert at a time;
    deciding for the pair keeps the peak monotone in the number of routed experts)."""
    per_expert = ckpt.w13.data.shape[1] * ckpt.hidden_size + ckpt.w2.data.shape[1] * ckpt.intermediate_size
    if len(experts) * per_expert * 8 <= EAGER_WEIGHT_BYTES:
        return tuple(dequantize_weight(w.experts(experts), ckpt.scheme.weight, ckpt).double()
                     for w in (ckpt.w13, ckpt.w2))
    return RoutedWeights(ckpt.w13, experts, ckpt), RoutedWeights(ckpt.w2, experts, ckpt)


@dataclass
class MoETrace:
    """Every intermediate of one reference forward, per (token, k) pair in row-major order (P = T k)."""

    structure: NumericalStructure
    a1: torch.Tensor  # [T, H] float64, GEMM1 input after activation quantization
    h_pre: torch.Tensor  # [P, N13] GEMM1 output (router weight included for GEMM1_EPILOGUE) before rounding
    h: torch.Tensor  # [P, N13] after the gemm1_out rounding point
    phi_pre: torch.Tensor  # [P, I] gate function before its own rounding (GATE_ROUNDED), else of y
    y_pre: torch.Tensor  # [P, I] activation output before the act_out rounding point
    y: torch.Tensor  # [P, I] after it
    a2: torch.Tensor  # [P, I] GEMM2 input after activation quantization
    z_pre: torch.Tensor  # [P, H] GEMM2 output (router weight included for GEMM2_EPILOGUE) before rounding
    z: torch.Tensor  # [P, H] after the gemm2_out rounding point
    term: torch.Tensor  # [P, H] what the top-k sum adds: w z, or z where the weight is already in
    acc_pre: torch.Tensor  # [T, k, H] SEQUENTIAL: the partial sums before each rounding (FP32: term sums)
    out_pre: torch.Tensor  # [T, H] before the output rounding
    out: torch.Tensor  # [T, H] float64, after it
    experts: torch.Tensor  # [R] the routed experts' ids, ascending: w13 and w2 hold theirs only
    w13: torch.Tensor | RoutedWeights  # [R, N13, H] float64 dequantized weights of the routed experts
    w2: torch.Tensor | RoutedWeights  # [R, H, I]
    pair_token: torch.Tensor  # [P] token of each pair
    pair_expert: torch.Tensor  # [P] expert of each pair
    pair_weight: torch.Tensor  # [P] routing weight of each pair (float64)
    a1_scale: torch.Tensor | None  # static a1 scale actually used (FP8 scale / NVFP4 decode global)
    a2_scale: torch.Tensor | None
    top_k: int


def round_bf16(x: torch.Tensor, enabled: bool = True) -> torch.Tensor:
    """float64 -> bf16 the way a kernel rounds: to fp32 (its accumulator), then to bf16, both RNE."""
    return round_to(x, Precision.BF16, enabled)


def static_activation_scales(ckpt: MoECheckpoint) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(a1, a2) static scales: the max over experts of the checkpoint's input scales, in the
    multiply-on-dequant direction. None for dynamic and A16 schemes."""
    aq = ckpt.scheme.act
    if aq is None or not aq.static:
        return None, None
    if ckpt.w13_input_scale is None or ckpt.w2_input_scale is None:
        raise ValueError(
            f"scheme {ckpt.scheme.name} quantizes activations with static scales, but the checkpoint has no "
            "w13_input_scale/w2_input_scale (a weight-only checkpoint run as W4A4?)"
        )
    scales = []
    for s in (ckpt.w13_input_scale, ckpt.w2_input_scale):
        s = aq.kind.static_scale(s, ckpt.nvfp4_global_convention)
        if not bool(torch.isfinite(s).all()) or not bool((s > 0).all()):
            raise ValueError(f"input scales must be positive and finite, got {s.tolist()}")
        scales.append(s.float().amax())
    return scales[0], scales[1]


def activation_qdq(x: torch.Tensor, aq: ActQuant | None, ckpt: MoECheckpoint, static_scale,
                   static_scale_apply: ScaleApply = ScaleApply.DIVIDE) -> torch.Tensor:
    """Quantize-dequantize GEMM-input activations [rows, K] along K as the scheme says (fp32 in, fp32 out).
    A static FP8 scale is applied as `static_scale_apply` says (the kernel's structure declares it)."""
    if aq is None:
        return x
    return aq.kind.qdq_activation(aq, x, ckpt.fp8_format, static_scale, static_scale_apply)


def check_moe_inputs(hidden_states, ckpt: MoECheckpoint, topk_weights, topk_ids) -> None:
    """The argument checks every MoE entry point shares (reference and backends)."""
    check_checkpoint(ckpt)
    if not isinstance(hidden_states, torch.Tensor) or hidden_states.dtype != torch.bfloat16:
        raise TypeError(f"hidden_states must be a bfloat16 tensor, got {getattr(hidden_states, 'dtype', type(hidden_states))}")
    if hidden_states.dim() != 2 or hidden_states.shape[1] != ckpt.hidden_size:
        raise ValueError(f"hidden_states must be [tokens, {ckpt.hidden_size}], got {tuple(hidden_states.shape)}")
    t = hidden_states.shape[0]
    if not isinstance(topk_ids, torch.Tensor) or topk_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"topk_ids must be an int32/int64 tensor, got {getattr(topk_ids, 'dtype', type(topk_ids))}")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != t:
        raise ValueError(f"topk_ids must be [tokens={t}, top_k], got {tuple(topk_ids.shape)}")
    if not 1 <= topk_ids.shape[1] <= ckpt.num_experts:
        raise ValueError(f"top_k must be in [1, num_experts={ckpt.num_experts}], got {topk_ids.shape[1]}")
    if topk_ids.numel() and (int(topk_ids.min()) < 0 or int(topk_ids.max()) >= ckpt.num_experts):
        raise ValueError(
            f"topk_ids must lie in [0, {ckpt.num_experts}), got values in [{int(topk_ids.min())}, {int(topk_ids.max())}]"
        )
    if not isinstance(topk_weights, torch.Tensor) or topk_weights.dtype != torch.float32:
        raise TypeError(f"topk_weights must be a float32 tensor, got {getattr(topk_weights, 'dtype', type(topk_weights))}")
    if tuple(topk_weights.shape) != tuple(topk_ids.shape):
        raise ValueError(f"topk_weights must have topk_ids' shape {tuple(topk_ids.shape)}, got {tuple(topk_weights.shape)}")
    if not bool(torch.isfinite(hidden_states).all()):
        raise ValueError("hidden_states must be finite (NaN/Inf found)")
    if not bool(torch.isfinite(topk_weights).all()):
        raise ValueError("topk_weights must be finite")
    if topk_ids.numel() and topk_ids.shape[1] > 1:
        ordered = topk_ids.sort(dim=1).values
        repeated = (ordered[:, 1:] == ordered[:, :-1]).any(1)
        if bool(repeated.any()):
            t_bad = int(repeated.nonzero()[0])
            raise ValueError(f"topk_ids must name distinct experts within each token's top-k (a router never picks "
                             f"one expert twice); token {t_bad} has {topk_ids[t_bad].tolist()}")


def evaluate_activation(h: torch.Tensor, act, structure: NumericalStructure, exact: bool = False):
    """(phi_pre, y_pre, y): the activation of GEMM1 outputs h as the structure evaluates it, in fp32
    (float64 when exact), with its rounding points (none when exact). phi_pre is the gate function
    before its own rounding where the structure rounds it (GATE_ROUNDED), else y_pre."""
    keep = not exact
    phi, psi = gate_and_up(h if exact else h.float(), act)
    if not act.gated:
        y_pre = phi.double()
        return y_pre, y_pre, round_to(y_pre, structure.act_out, keep)
    if structure.activation_eval(act) is ActivationEval.GATE_ROUNDED:
        phi_pre = phi.double()
        phi = round_to(phi_pre, structure.act_out, keep).to(phi.dtype)
        y_pre = (phi * psi).double()
    else:
        y_pre = (phi * psi).double()
        phi_pre = y_pre
    return phi_pre, y_pre, round_to(y_pre, structure.act_out, keep)


def fused_moe(
    hidden_states: torch.Tensor,
    ckpt: MoECheckpoint,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    structure: NumericalStructure | str = DEFAULT_STRUCTURE,
    exact: bool = False,
    trace: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, MoETrace]:
    """The reference MoE forward with `structure`'s numerics: bf16 [T, H] (float64 if exact) and
    optionally the trace."""
    check_moe_inputs(hidden_states, ckpt, topk_weights, topk_ids)
    st = structure_by_name(structure)
    st.check_top_k(topk_ids.shape[1])
    scheme, act, aq = ckpt.scheme, ckpt.activation, ckpt.scheme.act
    keep = not exact
    t, hsz = hidden_states.shape
    k = topk_ids.shape[1]
    # only the routed experts are dequantized, and beyond EAGER_WEIGHT_BYTES one at a time (routed_weights)
    experts = topk_ids.reshape(-1).long().unique()
    w13, w2 = routed_weights(experts, ckpt)
    a1_scale, a2_scale = static_activation_scales(ckpt)
    qdq = lambda x, s: activation_qdq(x, aq, ckpt, s, st.fp8_static_scale)  # noqa: E731

    a1 = qdq(hidden_states.float(), a1_scale).double()
    pair_token = torch.arange(t).repeat_interleave(k)
    pair_expert = topk_ids.reshape(-1).long()
    pair_weight = topk_weights.reshape(-1).double()
    p = t * k
    n13 = w13.shape[1]
    isz = ckpt.intermediate_size
    h_pre, h = torch.zeros(p, n13, dtype=torch.float64), torch.zeros(p, n13, dtype=torch.float64)
    phi_pre, y_pre, y, a2 = (torch.zeros(p, isz, dtype=torch.float64) for _ in range(4))
    z_pre, z = torch.zeros(p, hsz, dtype=torch.float64), torch.zeros(p, hsz, dtype=torch.float64)
    for i, e in enumerate(experts.tolist()):
        rows = (pair_expert == e).nonzero().flatten()
        we = pair_weight[rows, None]
        he = a1[pair_token[rows]] @ w13[i].T
        if ckpt.b13 is not None:
            he = he + ckpt.b13[e].double()
        if st.router_weight is RouterWeight.GEMM1_EPILOGUE:
            he = he * we
        h_pre[rows], h[rows] = he, round_to(he, st.gemm1_out, keep)
        phi_pre[rows], y_pre[rows], y[rows] = evaluate_activation(h[rows], act, st, exact)
        a2[rows] = qdq(y[rows].float(), a2_scale).double() if aq is not None else y[rows]
        ze = a2[rows] @ w2[i].T
        if ckpt.b2 is not None:
            ze = ze + ckpt.b2[e].double()
        if st.router_weight is RouterWeight.GEMM2_EPILOGUE:
            ze = ze * we
        z_pre[rows], z[rows] = ze, round_to(ze, st.gemm2_out, keep)
    term = z * pair_weight[:, None] if st.router_weight is RouterWeight.AFTER_GEMM2_ROUNDING else z
    terms = term.reshape(t, k, hsz)
    if st.topk_sum.for_top_k(k) is TopKSum.SEQUENTIAL:
        acc_pre = torch.empty_like(terms)
        acc = torch.zeros(t, hsz, dtype=torch.float64)
        for j in range(k):
            acc_pre[:, j] = acc + terms[:, j]
            acc = round_to(acc_pre[:, j], st.gemm2_out, keep)
        out_pre = acc
    else:
        acc_pre = terms.cumsum(1)
        out_pre = terms.sum(1)
    out = round_bf16(out_pre, keep)
    result = out if exact else out.to(torch.bfloat16)
    if not trace:
        return result
    return result, MoETrace(
        st, a1, h_pre, h, phi_pre, y_pre, y, a2, z_pre, z, term, acc_pre, out_pre, out, experts, w13, w2, pair_token,
        pair_expert, pair_weight, a1_scale, a2_scale, k,
    )
