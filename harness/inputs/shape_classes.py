"""Shape classes: the properties of real MoE layers that kernels break on, at sizes the CPU interpreter runs
in seconds. Each is data (one record), named after the model layer (harness.inputs.model_shapes) it comes
from, and keeps the one property that matters there while everything that only costs time shrinks: H and I
keep their remainder modulo 128 (a kernel's K tile), expert counts and ids stay (only routed experts cost
compute), top_k stays, token counts cross the same boundaries; hidden_states may be a strided view at a
storage offset (the padding around it poisoned with NaN: a kernel that ignores the strides reads it), and
topk_ids may be int32 (vLLM's fused_topk returns int32).

Block-FP8 schemes (128 x 128 weight blocks) skip the K-tail classes with that reason: the block-FP8 checkpoints
of real models (DeepSeek-V3, Kimi-K2, Qwen3 FP8) have H and every TP share of I in whole blocks of 128, and
vLLM refuses a share that is not (Qwen3-30B-A3B's I = 768 at TP 8: 96)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .model_shapes import MODEL_LAYERS

__all__ = ["ShapeClass", "SHAPE_CLASSES", "shape_class_by_name", "cpu_tail", "present_inputs", "LAYOUTS"]

LAYOUTS = ("contiguous", "strided")


def cpu_tail(n: int, tile: int = 128) -> int:
    """One K tile plus n's remainder modulo the tile (n itself when smaller): the same tail at CPU cost."""
    return n if n <= tile else tile + n % tile


@dataclass(frozen=True)
class ShapeClass:
    name: str
    origin: str  # the model layer / share / router the property comes from
    num_experts: int
    hidden_size: int
    intermediate_size: int
    tokens: int
    top_k: int
    routing: str = "random"  # harness.core.conformance.ROUTINGS
    layout: str = "contiguous"  # LAYOUTS
    ids_dtype: torch.dtype = torch.int64
    activation: str = "SILU"  # the origin model's; a backend without it runs its first supported one
    top_k_is_the_property: bool = False  # else a structure defined for fewer (top_k 1) runs it at its cap

    @property
    def shape_fields(self) -> tuple[int, int, int, int, int]:
        """harness.core.conformance.Shape's fields."""
        return (self.num_experts, self.hidden_size, self.intermediate_size, self.tokens, self.top_k)


def _tails(model: str, tp: int, **kw) -> ShapeClass:
    layer = MODEL_LAYERS[model]
    h, i = cpu_tail(layer.hidden_size), cpu_tail(layer.intermediate_size // tp)
    return ShapeClass(f"k_tails_{model}_tp{tp}", f"{layer.name(tp)}: H {layer.hidden_size} (mod 128 = "
                      f"{layer.hidden_size % 128}), I {layer.intermediate_size // tp} (mod 128 = "
                      f"{layer.intermediate_size // tp % 128})", 16, h, i, 5, layer.top_k,
                      activation=layer.activation, **kw)


def _experts(model: str, routing: str, tokens: int, label: str, experts: int, **kw) -> ShapeClass:
    """experts: enough to keep the property (ids past 255, top_k 10); fewer than the model's costs less."""
    layer = MODEL_LAYERS[model]
    return ShapeClass(f"{label}_{model}", f"{model}: {layer.num_experts} experts, top-{layer.top_k} (here {experts} experts)",
                      experts, 128, 128, tokens, layer.top_k, routing=routing, activation=layer.activation, **kw)


SHAPE_CLASSES = {
    c.name: c
    for c in (
        _tails("gpt-oss-120b", 1),  # H = 2880: 64 past a tile (MX, NVFP4 and FP8 per-tensor take it)
        _tails("gpt-oss-120b", 2),  # I = 1440: 32 past a tile (one MX block)
        _tails("gpt-oss-120b", 4),  # I = 720: 80 past a tile (NVFP4's 16, not MX's 32)
        _tails("gpt-oss-120b", 8),  # I = 360: 104 past a tile (8: unquantized and FP8 per-tensor only)
        # every token to the last k of 264 experts: ids 256..263 (past a uint8), the last id used, 256 experts empty
        _experts("kimi-k2", "skip_experts", 3, "expert_ids_past_255", 264),
        _experts("qwen3-next-80b-a3b", "random", 3, "top_k_10", 32, top_k_is_the_property=True),
        ShapeClass("top_k_1_llama-4-scout", "llama-4-scout: 16 experts, top-1", 16, 128, 128, 7, 1),
        ShapeClass("tokens_past_256_mixtral-8x7b", "mixtral-8x7b: top-2, 257 tokens (past a 256-token chunk)",
                   8, 128, 128, 257, 2),
        ShapeClass("all_to_one_expert", "every token to the same top_k experts (a skewed router)", 8, 128, 128, 9, 4,
                   routing="all_to_one"),
        ShapeClass("strided_hidden_states", "hidden_states a row-strided view at a storage offset (a slice of a "
                   "fused QKV/MoE input buffer)", 8, 128, 128, 9, 4, layout="strided"),
        ShapeClass("int32_topk_ids", "topk_ids as int32 (vLLM's fused_topk returns int32)", 8, 128, 128, 9, 4,
                   ids_dtype=torch.int32),
        ShapeClass("one_token", "decode of one token", 8, 128, 128, 1, 4),
    )
}


def shape_class_by_name(name: str) -> ShapeClass:
    try:
        return SHAPE_CLASSES[name]
    except KeyError:
        raise ValueError(f"unknown shape class {name!r}; expected one of {sorted(SHAPE_CLASSES)}") from None


def present_inputs(shape_class: ShapeClass, x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor):
    """The inputs as this class hands them to a backend (same values): hidden_states as a strided view whose
    surroundings are NaN, topk_ids in the class's integer dtype."""
    if shape_class.layout == "strided":
        pad_left, pad_right = 16, 48
        buf = torch.full((x.shape[0], pad_left + x.shape[1] + pad_right), float("nan"), dtype=x.dtype, device=x.device)
        buf[:, pad_left:pad_left + x.shape[1]] = x
        x = buf[:, pad_left:pad_left + x.shape[1]]
    elif shape_class.layout != "contiguous":
        raise ValueError(f"layout must be one of {LAYOUTS}, got {shape_class.layout!r}")
    return x, w, ids.to(shape_class.ids_dtype)
