"""A deliberately wrong backend: it forgets to quantize the GEMM2 input (a2) - a real bug class.

    .venv/bin/python -m pytest suites/test_conformance.py --backend examples.wrong_backend:make_backend \
        -k "w_mxfp4_a_mxfp4 and SILU/ and cpu"

fails with a message that names scheme, activation, backend, platform, stage (output), the element,
expected and got, and the distance in bf16 ulps. Weight-only schemes still pass: they have no a2 QDQ.
"""

from examples.simple_backend import SimpleBackend


class ForgetsA2Quantization(SimpleBackend):
    name = "wrong_example"

    def forward(self, prepared, hidden_states, topk_weights, topk_ids):
        ckpt, *rest = prepared
        scheme = ckpt.scheme
        if scheme.act is None:
            return super().forward(prepared, hidden_states, topk_weights, topk_ids)
        import dataclasses

        # quantize a1 as the scheme says, but run GEMM2 on unquantized activations
        from reference.moe import activation_qdq

        ckpt_a16 = dataclasses.replace(ckpt, scheme=dataclasses.replace(scheme, act=None))
        a1_scale = rest[2][0]
        a1 = activation_qdq(hidden_states.float(), scheme.act, ckpt, a1_scale)
        return super().forward((ckpt_a16, *rest), a1.bfloat16(), topk_weights, topk_ids)


def make_backend():
    return ForgetsA2Quantization()
