"""Activations and routing against independent formulas written out here (NUMERICS.md), element by
element in float64 Python, and hand-checked cases."""

from __future__ import annotations

import math

import pytest
import torch

from reference.activations import ACTIVATIONS, activation_by_name, apply_activation
from reference.routing import RoutingConfig, route


def _sigmoid(v):
    return 1 / (1 + math.exp(-v))


def _gelu(v):
    return 0.5 * v * (1 + math.erf(v / math.sqrt(2)))


def _gelu_tanh(v):
    return 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3)))


def _clamp(v, lo, hi):
    return min(max(v, lo), hi)


GATE = {
    "SILU": lambda g: g * _sigmoid(g),
    "GELU": _gelu,
    "GELU_TANH": _gelu_tanh,
    "RELU2": lambda g: max(g, 0.0) ** 2,
    "SITU": lambda g: 4 * math.tanh(g / 4) * _sigmoid(g),
}


def oracle(name: str, row: list[float]) -> list[float]:
    """One token's activation, from the formulas in NUMERICS.md."""
    if name.endswith("_NO_MUL"):
        return [GATE[name.removesuffix("_NO_MUL")](v) for v in row]
    n = len(row) // 2
    if name == "SWIGLUOAI":  # interleaved: gate at even positions, up at odd
        out = []
        for g, u in zip(row[0::2], row[1::2]):
            g, u = min(g, 7.0), _clamp(u, -7.0, 7.0)
            out.append((u + 1) * g * _sigmoid(1.702 * g))
        return out
    gates, ups = row[:n], row[n:]
    if name == "SWIGLUSTEP":
        return [min(GATE["SILU"](g), 7.0) * _clamp(u, -7.0, 7.0) for g, u in zip(gates, ups)]
    if name == "SITU":
        return [GATE["SITU"](g) * 25 * math.tanh(u / 25) for g, u in zip(gates, ups)]
    return [GATE[name](g) * u for g, u in zip(gates, ups)]


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_matches_the_written_out_formula(name):
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(3, 16, generator=g) * 4, torch.linspace(-30, 30, 16, dtype=torch.float32)[None]], 0)
    got = apply_activation(x.double(), ACTIVATIONS[name])
    expected = torch.tensor([oracle(name, row) for row in x.double().tolist()], dtype=torch.float64)
    assert torch.allclose(got, expected, rtol=1e-12, atol=1e-12), (got - expected).abs().max()


def test_silu_limit_clamps_gate_above_and_up_both_sides():
    act = activation_by_name("SILU").with_params(limit=2.0)
    x = torch.tensor([[5.0, -5.0, 5.0, -5.0]], dtype=torch.float64)  # gates 5, -5; ups 5, -5
    expected = [2 * _sigmoid(2) * 2, -5 * _sigmoid(-5) * -2]
    assert torch.allclose(apply_activation(x, act), torch.tensor([expected], dtype=torch.float64))


def test_swigluoai_reads_interleaved_gate_and_up():
    x = torch.tensor([[1.0, 0.0, 0.0, 3.0]], dtype=torch.float64)  # (g=1, u=0), (g=0, u=3)
    got = apply_activation(x, ACTIVATIONS["SWIGLUOAI"])
    assert torch.allclose(got, torch.tensor([[1 * _sigmoid(1.702), 0.0]], dtype=torch.float64))


def test_activation_errors():
    with pytest.raises(ValueError, match="unknown activation"):
        activation_by_name("swish")
    with pytest.raises(ValueError, match="even number"):
        apply_activation(torch.zeros(2, 3), ACTIVATIONS["SILU"])
    with pytest.raises(TypeError, match="fp32 or float64"):
        apply_activation(torch.zeros(2, 4, dtype=torch.bfloat16), ACTIVATIONS["SILU"])


# ---- routing -----------------------------------------------------------------------------------


def test_softmax_topk_renormalized():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    w, ids = route(logits, RoutingConfig(top_k=2))
    p = torch.softmax(logits, -1)[0]
    assert ids.tolist() == [[1, 2]]
    assert torch.allclose(w, torch.tensor([[p[1] / (p[1] + p[2]), p[2] / (p[1] + p[2])]]))


def test_ties_go_to_the_lower_expert_index():
    w, ids = route(torch.zeros(3, 8), RoutingConfig(top_k=3, renormalize=False))
    assert ids.tolist() == [[0, 1, 2]] * 3
    assert torch.allclose(w, torch.full((3, 3), 1 / 8))


def test_correction_bias_selects_but_weights_come_from_unbiased_scores():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    bias = torch.tensor([10.0, 0.0, 0.0, 0.0])  # expert 0 wins selection only through its bias
    w, ids = route(logits, RoutingConfig(top_k=2, scoring="sigmoid", renormalize=False), bias)
    assert ids.tolist() == [[0, 3]]
    assert torch.allclose(w, torch.sigmoid(torch.tensor([[0.0, 3.0]])))


def test_grouped_topk_keeps_the_best_groups_by_top2_sum_with_bias():
    # 4 groups of 2; biased scores make group 3 best (sum of its top 2), then group 0.
    logits = torch.tensor([[2.0, 2.0, 3.0, -9.0, 1.0, 1.0, 2.5, 2.5]])
    bias = torch.zeros(8)
    w, ids = route(logits, RoutingConfig(top_k=3, scoring="sigmoid", num_groups=4, topk_group=2,
                                          routed_scaling_factor=2.5), bias)
    # group sums: g0 = s(2)+s(2) = 1.76, g1 = s(3)+s(-9) = 0.95, g2 = 1.46, g3 = 1.85 -> keep g3, g0
    assert sorted(ids[0].tolist()) == [0, 6, 7]
    s = torch.sigmoid(logits[0, [6, 7, 0]])
    assert torch.allclose(w[0], s / s.sum() * 2.5)


def test_grouped_topk_without_bias_uses_group_max():
    logits = torch.tensor([[0.0, 5.0, 4.0, 4.0]])  # groups (0,1) max 5, (2,3) max 4
    _, ids = route(logits, RoutingConfig(top_k=2, num_groups=2, topk_group=1))
    assert ids.tolist() == [[1, 0]]


@pytest.mark.parametrize(
    "config, pattern",
    [
        (RoutingConfig(top_k=5), r"top_k must be in \[1, num_experts=4\]"),
        (RoutingConfig(top_k=0), r"top_k must be in"),
        (RoutingConfig(top_k=2, num_groups=3), "num_groups=3 must divide num_experts=4"),
        (RoutingConfig(top_k=2, num_groups=2, topk_group=3), r"topk_group must be in \[1, num_groups=2\]"),
        (RoutingConfig(top_k=3, num_groups=2, topk_group=1), "exceeds the 1 kept groups"),
        (RoutingConfig(top_k=2, scoring="relu"), "scoring must be"),
    ],
)
def test_routing_config_errors(config, pattern):
    with pytest.raises(ValueError, match=pattern):
        route(torch.zeros(2, 4), config)


def test_routing_input_errors():
    with pytest.raises(ValueError, match=r"\[tokens, experts\]"):
        route(torch.zeros(4), RoutingConfig(top_k=1))
    with pytest.raises(ValueError, match="finite"):
        route(torch.tensor([[float("nan"), 0.0]]), RoutingConfig(top_k=1))
    with pytest.raises(ValueError, match=r"e_score_correction_bias must have shape \(4,\)"):
        route(torch.zeros(2, 4), RoutingConfig(top_k=1), torch.zeros(3))
