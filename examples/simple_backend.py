"""A complete outside backend in 40 lines: run the whole suite on it with

    .venv/bin/python -m pytest suites/test_conformance.py --backend examples.simple_backend:make_backend

It dequantizes each routed expert's weights with the reference's public helpers, runs fp32 GEMMs,
quantizes activations as the scheme says, and rounds to bf16 where a fused kernel stores bf16. Where it
rounds, where it applies the router weight and how it sums the top-k terms is its numerical structure:
it declares it (here the built-in "rounded_terms"), and the suite computes the reference with it.
examples/wrong_structure_backend.py is the same code declaring another structure, and fails.
"""

import torch

from reference.activations import apply_activation
from reference.checkpoints import dequantize_weight
from reference.moe import activation_qdq, static_activation_scales


class SimpleBackend:
    name = "simple_example"
    # bf16 after each GEMM and after the activation (evaluated in fp32), router weight times the rounded
    # GEMM2 output, top-k terms summed in fp32, static FP8 scales divided (see reference/structure.py)
    numerical_structure = "rounded_terms"

    def supports(self, problem, platform):
        return True, "every scheme and activation, with any platform's FP8 dtype"

    def prepare(self, ckpt):
        # The backend's own layout: here, fp32 values per expert (a real backend would keep codes).
        w13 = dequantize_weight(ckpt.w13, ckpt.scheme.weight, ckpt)
        w2 = dequantize_weight(ckpt.w2, ckpt.scheme.weight, ckpt)
        return ckpt, w13, w2, static_activation_scales(ckpt)

    def forward(self, prepared, hidden_states, topk_weights, topk_ids):
        ckpt, w13, w2, (a1_scale, a2_scale) = prepared
        aq = ckpt.scheme.act
        t, k = topk_ids.shape
        a1 = activation_qdq(hidden_states.float(), aq, ckpt, a1_scale)
        out = torch.zeros(t, hidden_states.shape[1])
        for slot in range(k):
            for e in topk_ids[:, slot].unique().tolist():
                rows = (topk_ids[:, slot] == e).nonzero().flatten()
                h = a1[rows] @ w13[e].T + (ckpt.b13[e] if ckpt.b13 is not None else 0)
                y = apply_activation(h.bfloat16().float(), ckpt.activation).bfloat16().float()
                z = activation_qdq(y, aq, ckpt, a2_scale) @ w2[e].T + (ckpt.b2[e] if ckpt.b2 is not None else 0)
                out[rows] += topk_weights[rows, slot, None] * z.bfloat16().float()
        return out.bfloat16()


def make_backend():
    return SimpleBackend()


def make_class():
    return SimpleBackend  # a factory that forgot to call it (suites/test_hostile_backends.py)
