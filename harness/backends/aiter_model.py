"""aiter: a capability model of AMD AITER's fused MoE, for the oracle only.

AITER's fused MoE on gfx942/gfx950 takes SILU and GELU (and gpt-oss's SWIGLUOAI on gfx950) with FP8 or
MXFP4 weights (dequantized on gfx942), and rejects other activations; on gfx942 it rejected Kimi K3's SITU and
model init raised NotImplementedError. That is the failure the oracle's fallback must fix, so the
priority lists keep AITER first on AMD. The adapter itself (calling aiter.fused_moe) is not written:
no AMD machine is available to this project, so available() says so and forward() is never reached.
"""

from __future__ import annotations

_ACTIVATIONS = {"gfx942": {"SILU", "GELU"}, "gfx950": {"SILU", "GELU", "SWIGLUOAI"}}
_SCHEMES = {"gfx942": {"w_fp8_a_fp8", "w_fp8_a_fp8_block", "w_mxfp4"},
            "gfx950": {"w_fp8_a_fp8", "w_fp8_a_fp8_block", "w_mxfp4", "w_mxfp4_a_mxfp4"}}


class AiterCapabilityModel:
    name = "aiter"
    capability_model = True  # answers supports() for the oracle; nothing runs (marked in the dispatch table)
    # not measured (no AMD machine): declared as the default so the record is explicit, revisit with the adapter
    numerical_structure = "vllm_triton"

    def supports(self, problem, platform) -> tuple[bool, str]:
        if platform.name not in _ACTIVATIONS:
            return False, f"AITER runs on gfx942/gfx950, not {platform.name}"
        if problem.scheme.name not in _SCHEMES[platform.name]:
            return False, f"AITER fused MoE has no {problem.scheme.name} kernel on {platform.name}"
        if problem.activation.name not in _ACTIVATIONS[platform.name]:
            return False, f"AITER fused MoE does not implement activation {problem.activation.name} on {platform.name}"
        return True, "AITER fused MoE"

    def available(self, platform) -> tuple[bool, str]:
        return False, "capability model only: the AITER adapter is not written (no AMD hardware here)"

    def prepare(self, ckpt):
        raise NotImplementedError("the AITER adapter is not written; this backend is a capability model")

    def forward(self, prepared, hidden_states, topk_weights, topk_ids):
        raise NotImplementedError("the AITER adapter is not written; this backend is a capability model")


def make_backend() -> AiterCapabilityModel:
    return AiterCapabilityModel()
