"""A second MoE implementation in plain torch: dequantize each routed expert's weights, run the GEMMs
in fp32 (optionally on bf16 operands, optionally in a permuted accumulation order), and round, weight and
sum the way a declared numerical structure says (reference.structure), written here independently of the
reference's code. It is how vLLM's OCP MX emulation works today, the baseline for speed, and the "correct
kernel" of every structure that the derived bounds must never fail."""

from __future__ import annotations


import torch

from reference.activations import apply_activation, gate_and_up
from reference.checkpoints import MoECheckpoint, dequantize_weight
from reference.moe import activation_qdq, check_moe_inputs, static_activation_scales
from reference.structure import (DEFAULT_STRUCTURE, ActivationEval, NumericalStructure, RouterWeight, TopKSum,
                                 structure_by_name)

__all__ = ["moe_emulation", "truncating_accumulation"]


def moe_emulation(
    hidden_states: torch.Tensor,
    ckpt: MoECheckpoint,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    structure: NumericalStructure | str = DEFAULT_STRUCTURE,
    operand_dtype: torch.dtype = torch.bfloat16,
    k_permutation_seed: int | None = None,
    dequantize_all_experts: bool = False,
    narrow_accumulator: tuple[int, int] | None = None,
    accumulate=None,
) -> torch.Tensor:
    """structure: where this emulation rounds, applies the router weight and sums the top-k terms.
    k_permutation_seed: accumulate the GEMMs (and an fp32 top-k sum) in a permuted order.
    narrow_accumulator=(chunk, bits): accumulate like a tensor core with a narrow adder: each chunk of
    `chunk` products along K is summed and truncated (toward zero) to `bits` significand bits before it
    joins the fp32 sum. Its error is below 2^(1-bits) sum|a||w|: what a backend declaring
    accumulation_error = 2^(1-bits) may do.
    accumulate(a, w) -> fp32 [M, N]: a GEMM accumulation of its own in place of fp32's (a test's model of a
    matrix unit: harness.backends.emulation.truncating_accumulation)."""
    check_moe_inputs(hidden_states, ckpt, topk_weights, topk_ids)
    st = structure_by_name(structure)
    st.check_top_k(topk_ids.shape[1])
    scheme, aq = ckpt.scheme, ckpt.scheme.act
    t, hsz = hidden_states.shape
    k = topk_ids.shape[1]
    a1_scale, a2_scale = static_activation_scales(ckpt)
    a1 = activation_qdq(hidden_states.float(), aq, ckpt, a1_scale, st.fp8_static_scale)
    experts = torch.arange(ckpt.num_experts) if dequantize_all_experts else topk_ids.unique()
    w13_all = dequantize_weight(ckpt.w13, scheme.weight, ckpt) if dequantize_all_experts else None
    w2_all = dequantize_weight(ckpt.w2, scheme.weight, ckpt) if dequantize_all_experts else None
    gen = torch.Generator().manual_seed(k_permutation_seed) if k_permutation_seed is not None else None

    def gemm(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        a, w = a.to(operand_dtype).float(), w.to(operand_dtype).float()
        if gen is not None:  # a different accumulation order: permute the reduction dim
            perm = torch.randperm(a.shape[-1], generator=gen)
            a, w = a[:, perm], w[:, perm]
        if accumulate is not None:
            return accumulate(a, w)
        if narrow_accumulator is None:
            return a @ w.T
        chunk, bits = narrow_accumulator
        acc = torch.zeros(a.shape[0], w.shape[0], dtype=torch.float32)
        for k0 in range(0, a.shape[-1], chunk):
            part = a[:, k0 : k0 + chunk].double() @ w[:, k0 : k0 + chunk].double().T
            mant, exp = torch.frexp(part)  # |mant| in [0.5, 1): keep `bits` bits of it
            acc += torch.ldexp(torch.trunc(torch.ldexp(mant, torch.tensor(bits))), exp - bits).float()
        return acc

    def store(x: torch.Tensor, precision) -> torch.Tensor:  # an intermediate written in its dtype
        return x.to(precision.dtype).float()

    def activation(h: torch.Tensor) -> torch.Tensor:
        if st.activation_eval(ckpt.activation) is ActivationEval.GATE_ROUNDED and ckpt.activation.gated:
            phi, psi = gate_and_up(h, ckpt.activation)
            return store(store(phi, st.act_out) * psi, st.act_out)
        return store(apply_activation(h, ckpt.activation), st.act_out)

    terms = torch.zeros(t * k, hsz, dtype=torch.float32)
    flat_ids = topk_ids.reshape(-1)
    flat_w = topk_weights.reshape(-1, 1).float()
    tokens = torch.arange(t).repeat_interleave(k)
    for e in experts.tolist():
        rows = (flat_ids == e).nonzero().flatten()
        if rows.numel() == 0:
            continue
        if dequantize_all_experts:
            w13, w2 = w13_all[e], w2_all[e]
        else:
            w13 = _dequantize_expert(ckpt, "w13", e)
            w2 = _dequantize_expert(ckpt, "w2", e)
        h = gemm(a1[tokens[rows]], w13)
        if ckpt.b13 is not None:
            h = h + ckpt.b13[e]
        if st.router_weight is RouterWeight.GEMM1_EPILOGUE:
            h = h * flat_w[rows]
        y = activation(store(h, st.gemm1_out))
        z = gemm(activation_qdq(y, aq, ckpt, a2_scale, st.fp8_static_scale), w2)
        if ckpt.b2 is not None:
            z = z + ckpt.b2[e]
        if st.router_weight is RouterWeight.GEMM2_EPILOGUE:
            z = z * flat_w[rows]
        z = store(z, st.gemm2_out)
        terms[rows] = z * flat_w[rows] if st.router_weight is RouterWeight.AFTER_GEMM2_ROUNDING else z
    terms = terms.reshape(t, k, hsz)
    if st.topk_sum.for_top_k(k) is TopKSum.SEQUENTIAL:  # in top-k order, rounded to the intermediate dtype after each add
        acc = terms[:, 0].to(st.gemm2_out.dtype)
        for j in range(1, k):
            acc = (acc.float() + terms[:, j]).to(st.gemm2_out.dtype)
        return acc.to(torch.bfloat16)
    order = torch.randperm(k, generator=gen) if gen is not None else torch.arange(k)
    return terms[:, order].sum(1).to(torch.bfloat16)


def _dequantize_expert(ckpt: MoECheckpoint, name: str, e: int) -> torch.Tensor:
    """One expert's weight, dequantized alone (never all experts up front)."""
    return dequantize_weight(getattr(ckpt, name).experts(torch.tensor([e])), ckpt.scheme.weight, ckpt)[0]


def truncating_accumulation(truncation: float, step: int = 16):
    """The accumulation a backend declaring accumulation_truncation = `truncation` may do at worst: K in steps of
    `step` (the MMA K step), and after each step the running sum loses `truncation` of itself toward zero."""
    def accumulate(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        acc = torch.zeros(a.shape[0], w.shape[0], dtype=torch.float64)
        for k0 in range(0, a.shape[-1], step):
            acc = (acc + a[:, k0 : k0 + step].double() @ w[:, k0 : k0 + step].double().T) * (1 - truncation)
        return acc.float()
    return accumulate
