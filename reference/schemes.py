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
from .quantizers import FP8, MX, NVFP4, QUANTIZER_KINDS, QuantizerKind

__all__ = ["WeightQuant", "ActQuant", "Scheme", "SCHEMES", "scheme_by_name"]

@dataclass(frozen=True)
class _Quantization:
    """What one tensor's quantizer is: its kind (reference.quantizers: MX, NVFP4, FP8) and parameters. FP8
    codes are the platform's FP8 at run time (E4M3FN on sm90/sm100/gfx950, E4M3FNUZ on gfx942), so a
    record stores E4M3FN as the default."""

    kind: QuantizerKind
    elem: FloatFormat
    granularity: Granularity | None = None  # fp8: PER_TENSOR, PER_TOKEN or PER_BLOCK
    block_shape: tuple[int, int] | None = None  # fp8 PER_BLOCK: (128, 128) weights, (1, 128) activations

    def __post_init__(self):
        if not isinstance(self.kind, QuantizerKind):
            raise TypeError(f"{type(self).__name__}.kind must be one of {QUANTIZER_KINDS}, got {self.kind!r}")

    @property
    def k_block(self) -> int:
        return self.kind.k_block(self)


@dataclass(frozen=True)
class WeightQuant(_Quantization):
    scale_mode: ScaleMode = ScaleMode.FLOOR  # mx: how the checkpoint builder picked its scales

    @property
    def label(self) -> str:
        return self.kind.weight_label(self)


@dataclass(frozen=True)
class ActQuant(_Quantization):
    static: bool = False  # fp8/nvfp4: the global/tensor scale comes from the checkpoint's input scales

    @property
    def label(self) -> str:
        return self.kind.act_label(self)


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
        return max([1] + [q.k_block for q in (self.weight, self.act) if q is not None])

    def n_multiple(self) -> int:
        """Output rows of each weight must be multiples of this (fp8 128x128 weight blocks)."""
        return self.weight.kind.n_block(self.weight) if self.weight else 1


_MXFP4 = WeightQuant(MX, E2M1)
_MXFP6_E3M2 = WeightQuant(MX, E3M2)
_MXFP6_E2M3 = WeightQuant(MX, E2M3)
_MXFP8 = WeightQuant(MX, E4M3FN)
_NVFP4 = WeightQuant(NVFP4, E2M1)
_FP8_TENSOR = WeightQuant(FP8, E4M3FN, Granularity.PER_TENSOR)
_FP8_BLOCK = WeightQuant(FP8, E4M3FN, Granularity.PER_BLOCK, (128, 128))

_A_MXFP4 = ActQuant(MX, E2M1)
_A_MXFP6_E3M2 = ActQuant(MX, E3M2)
_A_MXFP6_E2M3 = ActQuant(MX, E2M3)
_A_NVFP4 = ActQuant(NVFP4, E2M1, static=True)
_A_FP8_STATIC = ActQuant(FP8, E4M3FN, Granularity.PER_TENSOR, static=True)
_A_FP8_BLOCK = ActQuant(FP8, E4M3FN, Granularity.PER_BLOCK, (1, 128))

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
