"""The MoE layers real models have, as conformance shapes: each named after its model and tensor-parallel
share (a rank's slice of the intermediate size). Facts from the models' published configs (config.json:
num_local_experts / n_routed_experts, num_experts_per_tok, hidden_size, moe_intermediate_size /
intermediate_size)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ModelLayer", "MODEL_LAYERS", "model_case_shapes"]


@dataclass(frozen=True)
class ModelLayer:
    model: str
    num_experts: int
    top_k: int
    hidden_size: int
    intermediate_size: int
    activation: str
    biased: bool = False
    tp: tuple[int, ...] = (1,)  # tensor-parallel degrees served; a rank holds intermediate_size / tp
    # the schemes of the model's released quantized checkpoints (the model's own or its publisher's / NVIDIA's /
    # AMD's): what its real-shape cases run under the ci profile, besides bf16
    checkpoint_schemes: tuple[str, ...] = ()

    def shape(self, tp: int, tokens: int) -> tuple[int, int, int, int, int]:
        """(num_experts, hidden_size, intermediate_size, tokens, top_k): harness.core.conformance.Shape's fields."""
        if tp not in self.tp:
            raise ValueError(f"{self.model}: tp must be one of {self.tp}, got {tp}")
        return (self.num_experts, self.hidden_size, self.intermediate_size // tp, tokens, self.top_k)

    def name(self, tp: int) -> str:
        return self.model if tp == 1 else f"{self.model}/tp{tp}"


MODEL_LAYERS = {
    m.model: m
    for m in (
        # MXFP4 experts as released (W4A16 on Hopper)
        ModelLayer("gpt-oss-120b", 128, 4, 2880, 2880, "SWIGLUOAI", True, (1, 2, 4, 8), ("w_mxfp4",)),
        ModelLayer("gpt-oss-20b", 32, 4, 2880, 2880, "SWIGLUOAI", True, (1, 2, 4, 8), ("w_mxfp4",)),
        # FP8 128x128 blocks as released; MXFP4 W4A4 (AMD Quark's MX exports: seed #50516's Kimi checkpoint)
        ModelLayer("kimi-k2", 384, 8, 7168, 2048, "SILU", tp=(1, 8),
                   checkpoint_schemes=("w_fp8_a_fp8_block", "w_mxfp4_a_mxfp4")),
        # FP8 blocks as released; NVFP4 W4A4 (ModelOpt exports of DeepSeek-R1/V3)
        ModelLayer("deepseek-v3", 256, 8, 7168, 2048, "SILU", tp=(1, 8),
                   checkpoint_schemes=("w_fp8_a_fp8_block", "w_nvfp4_a_nvfp4")),
        ModelLayer("qwen3-235b-a22b", 128, 8, 4096, 1536, "SILU", tp=(1, 4),
                   checkpoint_schemes=("w_fp8_a_fp8_block", "w_nvfp4_a_nvfp4")),
        ModelLayer("qwen3-30b-a3b", 128, 8, 2048, 768, "SILU", tp=(1, 2), checkpoint_schemes=("w_fp8_a_fp8_block",)),
        # FP8 per-tensor, static activation scales (the FP8 checkpoints vLLM's per-tensor path was built for)
        ModelLayer("mixtral-8x7b", 8, 2, 4096, 14336, "SILU", tp=(1, 8), checkpoint_schemes=("w_fp8_a_fp8",)),
        ModelLayer("qwen3-next-80b-a3b", 512, 10, 2048, 512, "SILU", tp=(1, 2),
                   checkpoint_schemes=("w_fp8_a_fp8_block",)),
        # NVFP4 (ModelOpt); NVFP4 weights with bf16 activations is the W4A16 form of the same checkpoint
        ModelLayer("llama-4-scout", 16, 1, 5120, 8192, "SILU", tp=(1, 8),
                   checkpoint_schemes=("w_nvfp4_a_nvfp4", "w_nvfp4")),
    )
}


def model_case_shapes(models=None, tps=None, tokens=(1, 8, 64)):
    """(name, layer, shape fields) for each model, TP share and token count asked for (default: all)."""
    for layer in (MODEL_LAYERS[m] for m in (models or MODEL_LAYERS)):
        for tp in (t for t in layer.tp if tps is None or t in tps):
            for n in tokens:
                yield f"{layer.name(tp)}/T{n}", layer, layer.shape(tp, n)
