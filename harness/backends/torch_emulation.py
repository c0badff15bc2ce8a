"""torch_emulation: dequantize every expert to bf16 up front, then bf16 GEMMs in plain torch.

This is how vLLM's OCP MX emulation works today: a second implementation of the MoE, and the speed
baseline that fused kernels must beat. It runs anywhere and simulates any platform's semantics (the
FP8 dtype comes with the checkpoint). Activation quantization uses the reference quantizers."""

from __future__ import annotations

import torch

from harness.backends.emulation import moe_emulation
from reference.checkpoints import MoECheckpoint
from reference.structure import STRUCTURES


class TorchEmulationBackend:
    name = "torch_emulation"
    operand_dtype = torch.bfloat16  # dequantized weights and QDQ'd activations are rounded to bf16
    numerical_structure = STRUCTURES["vllm_triton"]  # the structure of the vLLM MoE it stands in for

    def supports(self, problem, platform) -> tuple[bool, str]:
        return True, "pure torch: every scheme and activation, any platform's semantics"

    def available(self, platform) -> tuple[bool, str]:
        return True, ""

    def prepare(self, ckpt: MoECheckpoint) -> MoECheckpoint:
        return ckpt

    def forward(self, prepared: MoECheckpoint, hidden_states, topk_weights, topk_ids) -> torch.Tensor:
        return moe_emulation(hidden_states, prepared, topk_weights, topk_ids, structure=self.numerical_structure,
                             operand_dtype=torch.bfloat16, dequantize_all_experts=True)


def make_backend() -> TorchEmulationBackend:
    return TorchEmulationBackend()
