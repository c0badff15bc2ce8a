"""Quantization schemes: one frozen record each. Suites iterate SCHEMES; adding a scheme is one record
(plus a reference function only if it brings a new kind of quantizer).

A scheme says how the checkpoint stores the expert weights (`weight`) and how the MoE quantizes the
activations that enter each GEMM (`act`: a1 into GEMM1, a2 into GEMM2; None = they stay bf16, a
weight-only "A16" scheme). Where a kernel rounds is not the scheme's business: each backend declares its
numerical structure (reference.structure).
"""

from __future__ import annotations

from dataclasses import dataclass

from .formats import E2M1, E2M3, E3M2, E4M3FN, FloatFormat
from .fp8 import Granularity
from .mx import ScaleMode

__all__ = ["WeightQuant", "ActQuant", "Scheme", "SCHEMES", "scheme_by_name"]

# `kind` names the quantizer family; "fp8" formats are the platform's FP8 dtype at run time
# (E4M3FN on sm90/sm100/gfx950, E4M3FNUZ on gfx942), so a record stores E4M3FN as the default.
KINDS = ("mx", "nvfp4", "fp8")


@dataclass(frozen=True)
class WeightQuant:
    kind: str
    elem: FloatFormat
    granularity: Granularity | None = None  # fp8 only: PER_TENSOR (one scale per expert) or PER_BLOCK
    block_shape: tuple[int, int] | None = None  # fp8 PER_BLOCK: (128, 128)
    scale_mode: ScaleMode = ScaleMode.FLOOR  # mx: how the checkpoint builder picked its scales

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"WeightQuant.kind must be one of {KINDS}, got {self.kind!r}")

    @property
    def label(self) -> str:
        if self.kind == "mx":
            return f"mx{self.elem.name}"
        if self.kind == "nvfp4":
            return "nvfp4"
        g = "per-tensor" if self.granularity is Granularity.PER_TENSOR else f"block{self.block_shape}"
        return f"fp8 {g}"


@dataclass(frozen=True)
class ActQuant:
    kind: str
    elem: FloatFormat
    granularity: Granularity | None = None  # fp8: PER_TENSOR (static) or PER_BLOCK (dynamic 1x128)
    block_shape: tuple[int, int] | None = None
    static: bool = False  # fp8/nvfp4: the global/tensor scale comes from the checkpoint's input scales

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"ActQuant.kind must be one of {KINDS}, got {self.kind!r}")

    @property
    def label(self) -> str:
        if self.kind == "mx":
            return f"mx{self.elem.name} dynamic"
        if self.kind == "nvfp4":
            return "nvfp4 (static global, dynamic blocks)"
        g = "per-tensor" if self.granularity is Granularity.PER_TENSOR else f"block{self.block_shape}"
        return f"fp8 {g} {'static' if self.static else 'dynamic'}"


@dataclass(frozen=True)
class Scheme:
    name: str
    weight: WeightQuant | None  # None: unquantized bf16 weights
    act: ActQuant | None  # None: activations stay bf16 (A16)
    description: str = ""

    @property
    def weight_only(self) -> bool:
        return self.weight is not None and self.act is None

    @property
    def needs_input_scales(self) -> bool:
        return self.act is not None and self.act.static

    @property
    def weight_label(self) -> str:
        return self.weight.label if self.weight else "bf16"

    @property
    def act_label(self) -> str:
        return self.act.label if self.act else "bf16 (A16)"

    def k_multiple(self) -> int:
        """H and I must be multiples of this (the blocks of every quantizer along K)."""
        blocks = [1]
        for q in (self.weight, self.act):
            if q is None:
                continue
            if q.kind == "mx":
                blocks.append(32)
            elif q.kind == "nvfp4":
                blocks.append(16)
            elif q.block_shape:
                blocks.append(q.block_shape[-1])
        return max(blocks)

    def n_multiple(self) -> int:
        """Output rows of each weight must be multiples of this (fp8 128x128 weight blocks)."""
        if self.weight and self.weight.kind == "fp8" and self.weight.block_shape:
            return self.weight.block_shape[0]
        return 1


_MXFP4 = WeightQuant("mx", E2M1)
_MXFP6_E3M2 = WeightQuant("mx", E3M2)
_MXFP6_E2M3 = WeightQuant("mx", E2M3)
_MXFP8 = WeightQuant("mx", E4M3FN)
_NVFP4 = WeightQuant("nvfp4", E2M1)
_FP8_TENSOR = WeightQuant("fp8", E4M3FN, Granularity.PER_TENSOR)
_FP8_BLOCK = WeightQuant("fp8", E4M3FN, Granularity.PER_BLOCK, (128, 128))

_A_MXFP4 = ActQuant("mx", E2M1)
_A_MXFP6_E3M2 = ActQuant("mx", E3M2)
_A_MXFP6_E2M3 = ActQuant("mx", E2M3)
_A_NVFP4 = ActQuant("nvfp4", E2M1, static=True)
_A_FP8_STATIC = ActQuant("fp8", E4M3FN, Granularity.PER_TENSOR, static=True)
_A_FP8_BLOCK = ActQuant("fp8", E4M3FN, Granularity.PER_BLOCK, (1, 128))

SCHEMES: dict[str, Scheme] = {
    s.name: s
    for s in (
        Scheme("bf16", None, None, description="unquantized baseline"),
        Scheme("w_mxfp4", _MXFP4, None, description="MXFP4 weights, bf16 activations (gpt-oss W4A16)"),
        Scheme("w_mxfp4_a_mxfp4", _MXFP4, _A_MXFP4, description="MXFP4 weights and activations (W4A4)"),
        Scheme("w_mxfp4_a_fp8", _MXFP4, _A_FP8_STATIC,
               description="MXFP4 weights, FP8 per-tensor activations with a static input scale (max over experts)"),
        Scheme("w_mxfp8", _MXFP8, None, description="MXFP8 (E4M3) weights, bf16 activations"),
        Scheme("w_mxfp6_e3m2", _MXFP6_E3M2, None, description="MXFP6 E3M2 weights, bf16 activations"),
        Scheme("w_mxfp6_e2m3", _MXFP6_E2M3, None, description="MXFP6 E2M3 weights, bf16 activations"),
        Scheme("w_mxfp4_a_mxfp6_e3m2", _MXFP4, _A_MXFP6_E3M2, description="MXFP4 weights, MXFP6 E3M2 activations"),
        Scheme("w_mxfp4_a_mxfp6_e2m3", _MXFP4, _A_MXFP6_E2M3, description="MXFP4 weights, MXFP6 E2M3 activations"),
        Scheme("w_mxfp6_e3m2_a_mxfp6_e3m2", _MXFP6_E3M2, _A_MXFP6_E3M2, description="MXFP6 E3M2 weights and activations"),
        Scheme("w_mxfp6_e2m3_a_mxfp6_e2m3", _MXFP6_E2M3, _A_MXFP6_E2M3, description="MXFP6 E2M3 weights and activations"),
        Scheme("w_mxfp6_e3m2_a_fp8", _MXFP6_E3M2, _A_FP8_STATIC,
               description="MXFP6 E3M2 weights, FP8 per-tensor static activations"),
        Scheme("w_nvfp4_a_nvfp4", _NVFP4, _A_NVFP4,
               description="NVFP4 weights and activations; one a2 global scale shared by all experts"),
        Scheme("w_nvfp4", _NVFP4, None, description="NVFP4 weights, bf16 activations (no input scales)"),
        Scheme("w_fp8_a_fp8", _FP8_TENSOR, _A_FP8_STATIC,
               description="FP8 per-tensor (per-expert) weights, FP8 per-tensor static activations"),
        Scheme("w_fp8_a_fp8_block", _FP8_BLOCK, _A_FP8_BLOCK,
               description="FP8 128x128-block weights, FP8 1x128 dynamic activations (DeepSeek-V3 style)"),
    )
}


def scheme_by_name(name: str) -> Scheme:
    if isinstance(name, Scheme):
        return name
    try:
        return SCHEMES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown scheme {name!r}; expected one of {sorted(SCHEMES)}") from None
