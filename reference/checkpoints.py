"""MoE checkpoints in checkpoint layout, and builders of realistic dummy ones.

Layout (per expert e; K is the input dim, quantized along it):
  w13  [E, N13, H]  N13 = 2I for gated activations (gate rows then up rows, or interleaved gate/up rows
                    for SWIGLUOAI, as gpt-oss stores them), I for *_NO_MUL
  w2   [E, H, I]
  codes: FP4 packed two per byte along K ([E, N, K/2], element 2j in the low nibble); FP6 and FP8 one
  code per byte ([E, N, K]; FP6 bit-packing is a backend layout); bf16 weights as bf16.
  scales: MX E8M0 [E, N, K/32]; NVFP4 E4M3 [E, N, K/16] plus one fp32 global scale per expert [E];
  FP8 fp32 [E, 1, 1] (per-tensor) or [E, N/128, K/128].
NVFP4 global scales come in two conventions (a wrong multiply/divide by them is a real bug):
  "decode"  ModelOpt: weight_scale_2 = amax / 2688, input_scale = amax / 2688 (dequant multiplies)
  "encode"  compressed-tensors: weight_global_scale = 2688 / amax, input_global_scale likewise
Activation input scales (static schemes only) are per expert [E]; the MoE uses the max over experts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .activations import Activation, activation_by_name, apply_activation
from .formats import E4M3FN, E4M3FNUZ, FloatFormat
from .quantizers import NVFP4_CONVENTIONS, nvfp4_decode_scale
from .schemes import Scheme, WeightQuant, scheme_by_name

__all__ = [
    "QuantizedWeight", "MoECheckpoint", "make_checkpoint", "dequantize_weight", "nvfp4_decode_scale", "NVFP4_CONVENTIONS",
    "check_checkpoint",
]



@dataclass(frozen=True)
class QuantizedWeight:
    data: torch.Tensor  # bf16 values, or uint8 codes (FP4 packed)
    scale: torch.Tensor | None = None  # MX/NVFP4 uint8 block scales; FP8 fp32 scales
    global_scale: torch.Tensor | None = None  # NVFP4 [E] fp32, direction per the checkpoint's convention

    def experts(self, ids: torch.Tensor) -> "QuantizedWeight":
        """These experts' weights only (every field is per expert along dim 0)."""
        pick = lambda t: None if t is None else t[ids]  # noqa: E731
        return QuantizedWeight(self.data[ids], pick(self.scale), pick(self.global_scale))


@dataclass(frozen=True)
class MoECheckpoint:
    scheme: Scheme
    activation: Activation
    w13: QuantizedWeight
    w2: QuantizedWeight
    hidden_size: int
    intermediate_size: int
    b13: torch.Tensor | None = None  # fp32 [E, N13]
    b2: torch.Tensor | None = None  # fp32 [E, H]
    w13_input_scale: torch.Tensor | None = None  # fp32 [E]: the a1 scale (FP8 per-tensor; NVFP4 global)
    w2_input_scale: torch.Tensor | None = None  # fp32 [E]: the a2 scale
    nvfp4_global_convention: str = "decode"
    fp8_format: FloatFormat = E4M3FN

    @property
    def num_experts(self) -> int:
        return self.w13.data.shape[0]

    def with_weight(self, name: str, weight: QuantizedWeight) -> "MoECheckpoint":
        return replace(self, **{name: weight})

    def map_tensors(self, fn) -> "MoECheckpoint":
        """The checkpoint with fn applied to every tensor (weights, scales, biases, input scales)."""
        f = lambda t: None if t is None else fn(t)  # noqa: E731
        weights = {n: QuantizedWeight(f(w.data), f(w.scale), f(w.global_scale))
                   for n, w in (("w13", self.w13), ("w2", self.w2))}
        others = {n: f(getattr(self, n)) for n in ("b13", "b2", "w13_input_scale", "w2_input_scale")}
        return replace(self, **weights, **others)

    def to(self, device) -> "MoECheckpoint":
        return self.map_tensors(lambda t: t.to(device))


def _weight_layout(wq: WeightQuant | None, e: int, n: int, k: int, fp8_format: FloatFormat):
    """(data shape, data dtype, scale shape or None, scale dtype, global scale shape or None, what) of one
    weight [E, N, K] in checkpoint layout."""
    if wq is None:
        return (e, n, k), torch.bfloat16, None, None, None, "bf16 values"
    return wq.kind.weight_layout(wq, e, n, k, fp8_format)


def _check_tensor(t, name: str, shape, dtype, what: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor ({what}), got {type(t).__name__}")
    if t.is_meta:
        raise ValueError(f"{name} is on the meta device (a shape without data)")
    if tuple(t.shape) != tuple(shape) or t.dtype != dtype:
        raise ValueError(f"{name} must be {list(shape)} {str(dtype).removeprefix('torch.')} ({what}), got "
                         f"{list(t.shape)} {str(t.dtype).removeprefix('torch.')}")


def check_checkpoint(ckpt: "MoECheckpoint") -> None:
    """Every field of a checkpoint against its scheme, activation and sizes, each error naming the field
    (w13 or w2, data or scale) and the layout expected."""
    if not isinstance(ckpt, MoECheckpoint):
        raise TypeError(f"ckpt must be a reference.checkpoints.MoECheckpoint, got {type(ckpt).__name__}")
    for name in ("hidden_size", "intermediate_size"):
        v = getattr(ckpt, name)
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"ckpt.{name} must be a positive int, got {v!r}")
    for name in ("w13", "w2"):
        if not isinstance(getattr(ckpt, name), QuantizedWeight):
            raise TypeError(f"ckpt.{name} must be a QuantizedWeight, got {type(getattr(ckpt, name)).__name__}")
    if not isinstance(ckpt.w13.data, torch.Tensor) or ckpt.w13.data.dim() != 3:
        raise ValueError(f"ckpt.w13.data must be a 3-d tensor [E, N13, H], got {getattr(ckpt.w13.data, 'shape', None)}")
    e, h, i = ckpt.w13.data.shape[0], ckpt.hidden_size, ckpt.intermediate_size
    n13 = 2 * i if ckpt.activation.gated else i
    wq = ckpt.scheme.weight
    for name, n, k, dims in (("w13", n13, h, "[E, N13, H]"), ("w2", h, i, "[E, H, I]")):
        w = getattr(ckpt, name)
        data_shape, data_dtype, scale_shape, scale_dtype, global_shape, what = _weight_layout(wq, e, n, k, ckpt.fp8_format)
        _check_tensor(w.data, f"ckpt.{name}.data", data_shape, data_dtype,
                      f"{dims} = {[e, n, k]} for {ckpt.scheme.name}/{ckpt.activation.name}: {what}")
        if scale_shape is None:
            if w.scale is not None:
                raise ValueError(f"ckpt.{name}.scale must be None for {ckpt.scheme.name} (bf16 weights)")
        else:
            _check_tensor(w.scale, f"ckpt.{name}.scale", scale_shape, scale_dtype, f"{ckpt.scheme.name} {what}")
        if global_shape is not None:
            _check_tensor(w.global_scale, f"ckpt.{name}.global_scale", global_shape, torch.float32,
                          f"one NVFP4 global scale per expert ({ckpt.nvfp4_global_convention} direction)")
    for name, n in (("b13", n13), ("b2", h)):
        b = getattr(ckpt, name)
        if b is not None:
            _check_tensor(b, f"ckpt.{name}", (e, n), torch.float32, "fp32 per-expert bias")
    if ckpt.scheme.needs_input_scales:
        for name in ("w13_input_scale", "w2_input_scale"):
            if getattr(ckpt, name) is not None:
                _check_tensor(getattr(ckpt, name), f"ckpt.{name}", (e,), torch.float32, "static scale per expert")


def dequantize_weight(w: QuantizedWeight, wq: WeightQuant | None, ckpt: MoECheckpoint) -> torch.Tensor:
    """The fp32 values a checkpoint weight means, [E, N, K]."""
    if wq is None:
        return w.data.float()
    return wq.kind.dequantize_weight(wq, w.data, w.scale, w.global_scale, ckpt.nvfp4_global_convention,
                                     ckpt.fp8_format)


def _quantize_weight(w: torch.Tensor, wq: WeightQuant | None, convention: str, fp8_format: FloatFormat) -> QuantizedWeight:
    if wq is None:
        return QuantizedWeight(w.to(torch.bfloat16))
    return QuantizedWeight(*wq.kind.quantize_weight(wq, w, convention, fp8_format))


def _dummy_weight(g: torch.Generator, e: int, n: int, k: int, outliers: int, outlier_scale: float) -> torch.Tensor:
    """Gaussian weights scaled by 1/sqrt(k), with a few input channels per expert `outlier_scale` times
    larger (the outlier channels that make per-block scales matter), rounded to bf16 as a checkpoint is."""
    w = torch.randn(e, n, k, generator=g, device="cpu") / k**0.5
    for i in range(e):
        cols = torch.randperm(k, generator=g, device="cpu")[:outliers]
        w[i, :, cols] *= outlier_scale
    return w.to(torch.bfloat16).float()


def make_checkpoint(
    scheme: Scheme | str,
    activation: Activation | str,
    num_experts: int,
    hidden_size: int,
    intermediate_size: int,
    *,
    seed: int = 0,
    with_bias: bool = False,
    nvfp4_global_convention: str = "decode",
    fp8_format: FloatFormat = E4M3FN,
    outlier_channels: int = 2,
    outlier_scale: float = 16.0,
    calibration_tokens: int = 32,
    bias_scale: float = 1.0,
    distinct_experts: int | None = None,
    device: torch.device | str | None = None,
) -> MoECheckpoint:
    """A quantized MoE checkpoint from random bf16 weights with outlier channels.

    Static activation scales (FP8 per-tensor, NVFP4 globals) are calibrated on random bf16 tokens:
    per expert, from the amax that expert's input sees, jittered per expert so that "max over experts"
    differs from any single expert's. Weight-only schemes get no input scales at all.

    distinct_experts: quantize only this many experts from random weights and derive the others from them
    (_derived_experts: output rows rolled by whole scale blocks), so that a real model's expert count (384 at
    H 7168) costs a few experts' quantization; every expert still differs from every other.

    device: where the checkpoint is built and lives (default the CPU). The random draws are the CPU generator's
    either way (the same weights on any device); quantization, derivation and calibration run on `device`."""
    dev = torch.device("cpu" if device is None else device)
    args = (scheme, activation, num_experts, hidden_size, intermediate_size, seed, with_bias, nvfp4_global_convention,
            fp8_format, outlier_channels, outlier_scale, calibration_tokens, bias_scale, distinct_experts, dev)
    if dev.type == "cpu":  # a device context intercepts every torch call (Python-level cost): only off the CPU
        return _make_checkpoint(*args)
    with torch.device(dev):
        return _make_checkpoint(*args)


def _make_checkpoint(scheme, activation, num_experts, hidden_size, intermediate_size, seed, with_bias,
                     nvfp4_global_convention, fp8_format, outlier_channels, outlier_scale, calibration_tokens,
                     bias_scale, distinct_experts, dev: torch.device) -> MoECheckpoint:
    scheme = scheme_by_name(scheme)
    activation = activation_by_name(activation) if isinstance(activation, str) else activation
    if nvfp4_global_convention not in NVFP4_CONVENTIONS:
        raise ValueError(f"nvfp4_global_convention must be one of {NVFP4_CONVENTIONS}, got {nvfp4_global_convention!r}")
    if fp8_format not in (E4M3FN, E4M3FNUZ):
        raise ValueError(f"fp8_format must be E4M3FN or E4M3FNUZ, got {fp8_format!r}")
    for name, n in (("hidden_size", hidden_size), ("intermediate_size", intermediate_size)):
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"{name} must be an int, got {n!r} ({type(n).__name__})")
    for name, n, mult in (
        ("hidden_size", hidden_size, scheme.k_multiple()),
        ("intermediate_size", intermediate_size, max(scheme.k_multiple(), scheme.n_multiple())),
    ):
        if n <= 0 or n % mult:
            raise ValueError(f"{name}={n} must be a positive multiple of {mult} for scheme {scheme.name}")
    if hidden_size % scheme.n_multiple():
        raise ValueError(f"hidden_size={hidden_size} must be a multiple of {scheme.n_multiple()} for {scheme.name}")
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts <= 0:
        raise ValueError(f"num_experts must be a positive int, got {num_experts!r}")
    if distinct_experts is not None and (isinstance(distinct_experts, bool) or not isinstance(distinct_experts, int)
                                         or distinct_experts <= 0):
        raise ValueError(f"distinct_experts must be a positive int or None, got {distinct_experts!r}")
    base = num_experts if distinct_experts is None else min(distinct_experts, num_experts)
    g = torch.Generator(device="cpu").manual_seed(seed)
    n13 = 2 * intermediate_size if activation.gated else intermediate_size
    cpu = torch.device("cpu")  # the generator's draws, then moved
    w13 = _dummy_weight(g, base, n13, hidden_size, outlier_channels, outlier_scale).to(dev)
    w2 = _dummy_weight(g, base, hidden_size, intermediate_size, outlier_channels, outlier_scale).to(dev)
    # biases on the scale of the GEMM outputs they join (gpt-oss's are not small next to them): a bias
    # applied in the wrong place moves most outputs, not a few
    b13 = torch.randn(base, n13, generator=g, device=cpu).to(dev) * bias_scale if with_bias else None
    b2 = torch.randn(base, hidden_size, generator=g, device=cpu).to(dev) * bias_scale if with_bias else None
    q13 = _quantize_weight(w13, scheme.weight, nvfp4_global_convention, fp8_format)
    q2 = _quantize_weight(w2, scheme.weight, nvfp4_global_convention, fp8_format)
    if base < num_experts:
        q13, b13, q2, b2 = _derived_experts(q13, b13, q2, b2, num_experts, scheme.n_multiple(), activation)
    ckpt = MoECheckpoint(
        scheme=scheme,
        activation=activation,
        w13=q13,
        w2=q2,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        b13=b13,
        b2=b2,
        nvfp4_global_convention=nvfp4_global_convention,
        fp8_format=fp8_format,
    )
    if not scheme.needs_input_scales:
        return ckpt
    x_cal = torch.randn(calibration_tokens, hidden_size, generator=g, device=cpu).to(torch.bfloat16).float().to(dev)
    jitter = 0.75 + 0.5 * torch.rand(num_experts, generator=g, device=cpu).to(dev)
    a1_amax = x_cal.abs().amax() * jitter
    # a derived expert's GEMM1 outputs are its base's, permuted (and so are their amax)
    of_base = torch.arange(num_experts) % base
    # GEMM2's statistic in float64, rounded to fp32 once: an fp32 GEMM's summation order and its activation's
    # libm are the device's (CPU and H200 a few ulps apart, results/gpu-issue25/run-6); in float64 they agree to
    # ~1e-13 relative, far inside one fp32 step, so a checkpoint is the same wherever it is built. One base expert
    # at a time: Mixtral's 8 experts' GEMM1 weights in float64 are 7.5 GB
    x64 = x_cal.double()
    base_amax = []
    for e in range(base):
        h = x64 @ dequantize_weight(ckpt.w13.experts(torch.tensor([e])), scheme.weight, ckpt)[0].double().T
        if b13 is not None:
            h = h + b13[e].double()
        base_amax.append(apply_activation(h, activation).abs().amax())
    a2_amax = (torch.stack(base_amax)[of_base] * jitter.flip(0).double()).float()
    return replace(
        ckpt,
        w13_input_scale=_input_scale(a1_amax, scheme, nvfp4_global_convention, fp8_format),
        w2_input_scale=_input_scale(a2_amax, scheme, nvfp4_global_convention, fp8_format),
    )


def _rolled_rows(t: torch.Tensor, rows: int, parts: int) -> torch.Tensor:
    """t's rows (dim 0) rolled by `rows` within each of `parts` equal parts."""
    return torch.cat([torch.roll(p, rows % p.shape[0], 0) for p in t.chunk(parts)])


def _derived_experts(q13: QuantizedWeight, b13, q2: QuantizedWeight, b2, num_experts: int, row_block: int,
                     activation: Activation):
    """(w13, b13, w2, b2) for num_experts experts from the first B: expert e is expert e mod B with its output
    rows (and their scale rows and biases) rolled by (e div B) whole scale blocks: w13 within its gate and up
    halves (by pairs of rows where they interleave, so each gate row keeps its up row), w2 over H. Rolled rows of
    a valid quantized weight are a valid quantized weight; every derived expert differs from its base (checked)."""
    base = q13.data.shape[0]
    parts, pair = (1, 2) if activation.gated and activation.interleaved else ((2, 1) if activation.gated else (1, 1))

    def rolled(q: QuantizedWeight, b, e: int, rows: int, parts: int) -> tuple[QuantizedWeight, torch.Tensor | None]:
        src, n = e % base, q.data.shape[1]
        scale = q.scale
        if scale is not None and scale.dim() >= 2 and scale.shape[1] * row_block == n:  # scale rows per row block
            scale = _rolled_rows(scale[src], rows // row_block, parts)
        elif scale is not None:
            scale = scale[src]
        glob = None if q.global_scale is None else q.global_scale[src]
        return (QuantizedWeight(_rolled_rows(q.data[src], rows, parts), scale, glob),
                None if b is None else _rolled_rows(b[src], rows, parts))

    n13, hsz = q13.data.shape[1], q2.data.shape[1]
    w13s, b13s, w2s, b2s = [], [], [], []
    made: dict[tuple[int, int, int], int] = {}
    for e in range(num_experts):
        shift = e // base
        r13, r2 = shift * row_block * pair, shift * row_block
        key = (e % base, r13 % (n13 // parts), r2 % hsz)
        if key in made:
            raise ValueError(f"expert {e} would repeat expert {made[key]}: {num_experts} experts need more than {base} "
                             f"distinct ones at N13 {n13}, H {hsz} (distinct_experts)")
        made[key] = e
        q, b = rolled(q13, b13, e, r13, parts)
        w13s.append(q), b13s.append(b)
        q, b = rolled(q2, b2, e, r2, 1)
        w2s.append(q), b2s.append(b)

    def stack(qs: list[QuantizedWeight]) -> QuantizedWeight:
        field = lambda name: None if getattr(qs[0], name) is None else torch.stack([getattr(q, name) for q in qs])  # noqa: E731
        return QuantizedWeight(torch.stack([q.data for q in qs]), field("scale"), field("global_scale"))

    both = lambda bs: None if bs[0] is None else torch.stack(bs)  # noqa: E731
    return stack(w13s), both(b13s), stack(w2s), both(b2s)


def _input_scale(amax: torch.Tensor, scheme: Scheme, convention: str, fp8_format: FloatFormat) -> torch.Tensor:
    return scheme.act.kind.calibrated_input_scale(amax, convention, fp8_format)
