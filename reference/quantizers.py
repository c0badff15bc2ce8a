"""Quantizer kinds as objects: MX, NVFP4 and FP8 each know their block along K, how a weight is stored in
a checkpoint (quantize, dequantize, layout), how activations are quantize-dequantized before a GEMM, how a
static input scale is read, and which values a re-quantization can produce for inputs in an interval (the
derived bound's candidates). A scheme's WeightQuant / ActQuant holds one of them; nothing else branches on
the kind. Adding a quantizer kind is one class here and its reference functions.

A record `q` (reference.schemes.WeightQuant or ActQuant) carries the parameters: the element format, the
FP8 granularity and block shape, the MX scale mode, whether activation scales are static.
"""

from __future__ import annotations

import torch

from .formats import FloatFormat, true_divide
from .fp8 import _MIN_SCALE_DIVISOR, Granularity, ScaleApply, dequantize_fp8, qdq_fp8, quantize_fp8
from .mx import ScaleMode, dequantize_mx, mx_shared_exponent, qdq_mx, quantize_mx
from .nvfp4 import (dequantize_nvfp4, nvfp4_block_scale_codes, nvfp4_global_encode_scale, qdq_nvfp4,
                    quantize_nvfp4)
from .packing import pack_fp4, unpack_fp4

__all__ = ["QuantizerKind", "MX", "NVFP4", "FP8", "QUANTIZER_KINDS", "NVFP4_CONVENTIONS", "nvfp4_decode_scale"]

# NVFP4 global scales come in two conventions (a wrong multiply/divide by them is a real bug):
#   "decode"  ModelOpt: weight_scale_2 = amax / 2688, input_scale = amax / 2688 (dequant multiplies)
#   "encode"  compressed-tensors: weight_global_scale = 2688 / amax, input_global_scale likewise
NVFP4_CONVENTIONS = ("decode", "encode")
_NVFP4_AMAX_DIVISOR = 448.0 * 6.0


def nvfp4_decode_scale(global_scale: torch.Tensor, convention: str) -> torch.Tensor:
    """The multiply-on-dequant direction, from a checkpoint's stored global scale."""
    if convention == "decode":
        return global_scale
    if convention == "encode":
        return 1.0 / global_scale
    raise ValueError(f"nvfp4_global_convention must be one of {NVFP4_CONVENTIONS}, got {convention!r}")


def _block_amax(a: torch.Tensor, block: int) -> torch.Tensor:
    return a.reshape(*a.shape[:-1], -1, block).amax(-1)


class QuantizerKind:
    """One kind of quantizer. Compared by identity: `q.kind is MX`, never with a string."""

    name: str

    def __repr__(self) -> str:
        return self.name.upper()

    def __eq__(self, other):
        if isinstance(other, str):
            raise TypeError(f"compare quantizer kinds by identity (reference.quantizers.{self!r}), not with "
                            f"the string {other!r}")
        return self is other

    __hash__ = object.__hash__

    def k_block(self, q) -> int:
        """Elements along K that share a scale (K must be a multiple)."""
        raise NotImplementedError

    def n_block(self, q) -> int:
        """Weight rows that share a scale (the output dim must be a multiple)."""
        return 1

    def code_format(self, q, fp8_format: FloatFormat) -> FloatFormat:
        return q.elem

    def weight_label(self, q) -> str:
        raise NotImplementedError

    def act_label(self, q) -> str:
        raise NotImplementedError

    # weights in checkpoint layout: (data, scale, global_scale)
    def quantize_weight(self, q, w: torch.Tensor, convention: str, fp8_format: FloatFormat):
        raise NotImplementedError

    def dequantize_weight(self, q, data, scale, global_scale, convention: str, fp8_format: FloatFormat):
        raise NotImplementedError

    def weight_layout(self, q, e: int, n: int, k: int, fp8_format: FloatFormat):
        """(data shape, data dtype, scale shape, scale dtype, global scale shape or None, words)."""
        raise NotImplementedError

    def per_tensor_scale(self, q) -> bool:
        """One weight scale per expert (a size-1 scale dim is then not a block of the whole dim)."""
        return False

    def unit_scale(self, q):
        """The stored scale that means 1 (what padding blocks of zero codes carry): a code or a float."""
        raise NotImplementedError

    def random_weight(self, q, e: int, n: int, k: int, g: torch.Generator, device, fp8_format: FloatFormat):
        """(data, scale, global_scale) of a weight of moderate magnitude drawn directly in checkpoint layout
        on `device` (benchmarks at model size, where a reference quantization would take minutes)."""
        raise NotImplementedError

    # activations entering a GEMM [rows, K]
    def qdq_activation(self, q, x: torch.Tensor, fp8_format: FloatFormat, static_scale, scale_apply: ScaleApply):
        raise NotImplementedError

    def static_scale(self, stored: torch.Tensor, convention: str) -> torch.Tensor:
        """A checkpoint's static input scale in the multiply-on-dequant direction."""
        return stored

    def calibrated_input_scale(self, amax: torch.Tensor, convention: str, fp8_format: FloatFormat) -> torch.Tensor:
        """The static input scale a checkpoint stores for activations of this amax."""
        raise NotImplementedError(f"{self!r} activations have no static scale")

    def requantization_candidates(self, q, lo, hi, mag_lo, mag_hi, fp8_format, static_scale, scale_apply):
        """(values below, values above): every quantized value an input in [lo, hi] can take, for every
        block scale the inputs of its block can pick; their min and max bound the re-quantization."""
        raise NotImplementedError

    def act_scale_group(self, q) -> int | None:
        """How many consecutive activation elements of a row share a scale computed from their own values (so
        each one's quantized value depends on all of them): 1 for a static scale, the block for dynamic block
        scales, None when the whole row or tensor shares one (no two elements are independent)."""
        return self.k_block(q)


class _MX(QuantizerKind):
    name = "mx"

    def k_block(self, q) -> int:
        return 32

    def weight_label(self, q) -> str:
        return f"mx{q.elem.name}"

    def act_label(self, q) -> str:
        return f"mx{q.elem.name} dynamic"

    def unit_scale(self, q):
        return 127  # E8M0 2^0

    def quantize_weight(self, q, w, convention, fp8_format):
        mq = quantize_mx(w, q.elem, scale_mode=q.scale_mode)
        return (pack_fp4(mq.codes) if q.elem.nbits == 4 else mq.codes), mq.scales, None

    def dequantize_weight(self, q, data, scale, global_scale, convention, fp8_format):
        return dequantize_mx(unpack_fp4(data) if q.elem.nbits == 4 else data, scale, q.elem)

    def weight_layout(self, q, e, n, k, fp8_format):
        packed = q.elem.nbits == 4
        return ((e, n, k // 2) if packed else (e, n, k)), torch.uint8, (e, n, k // 32), torch.uint8, None, (
            f"{q.elem.name} codes{' packed two per byte along K' if packed else ''}, E8M0 scales per 32")

    def random_weight(self, q, e, n, k, g, device, fp8_format):
        scale = torch.randint(118, 124, (e, n, k // 32), generator=g, device=device, dtype=torch.uint8)
        return _random_codes(q.elem, (e, n, k), g, device), scale, None

    def qdq_activation(self, q, x, fp8_format, static_scale, scale_apply):
        return qdq_mx(x, q.elem)

    def requantization_candidates(self, q, lo, hi, mag_lo, mag_hi, fp8_format, static_scale, scale_apply):
        e_lo = mx_shared_exponent(_block_amax(mag_lo, 32), q.elem, ScaleMode.FLOOR)
        e_hi = mx_shared_exponent(_block_amax(mag_hi, 32), q.elem, ScaleMode.FLOOR)
        below, above = [], []
        for d in range(int((e_hi - e_lo).max()) + 1 if e_hi.numel() else 1):
            e = torch.minimum(e_lo + d, e_hi)
            below.append(qdq_mx(lo, q.elem, shared_exponent=e))
            above.append(qdq_mx(hi, q.elem, shared_exponent=e))
        return below, above


class _NVFP4(QuantizerKind):
    name = "nvfp4"

    def k_block(self, q) -> int:
        return 16

    def weight_label(self, q) -> str:
        return "nvfp4"

    def act_label(self, q) -> str:
        return "nvfp4 (static global, dynamic blocks)"

    def unit_scale(self, q):
        return 0x38  # E4M3 1.0

    def quantize_weight(self, q, w, convention, fp8_format):
        s_enc = nvfp4_global_encode_scale(w.abs().amax(dim=(1, 2)))
        nq = quantize_nvfp4(w, global_encode_scale=s_enc[:, None, None])
        stored = nq.global_decode_scale.reshape(-1) if convention == "decode" else s_enc
        return pack_fp4(nq.codes), nq.block_scales, stored.float()

    def dequantize_weight(self, q, data, scale, global_scale, convention, fp8_format):
        s_dec = nvfp4_decode_scale(global_scale, convention)
        return dequantize_nvfp4(unpack_fp4(data), scale, s_dec[:, None, None])

    def weight_layout(self, q, e, n, k, fp8_format):
        return (e, n, k // 2), torch.uint8, (e, n, k // 16), torch.uint8, (e,), "E2M1 codes packed along K, E4M3 scales per 16"

    def random_weight(self, q, e, n, k, g, device, fp8_format):
        # E4M3 block-scale codes 0x30..0x47: 0.5 .. 2.0
        scale = torch.randint(0x30, 0x48, (e, n, k // 16), generator=g, device=device, dtype=torch.uint8)
        return _random_codes(q.elem, (e, n, k), g, device), scale, torch.full((e,), 0.01, device=device)

    def qdq_activation(self, q, x, fp8_format, static_scale, scale_apply):
        return qdq_nvfp4(x, global_decode_scale=static_scale)

    def static_scale(self, stored, convention):
        return nvfp4_decode_scale(stored, convention)

    def calibrated_input_scale(self, amax, convention, fp8_format):
        return true_divide(amax, _NVFP4_AMAX_DIVISOR).float() if convention == "decode" else nvfp4_global_encode_scale(amax)

    def requantization_candidates(self, q, lo, hi, mag_lo, mag_hi, fp8_format, static_scale, scale_apply):
        s_enc = 1.0 / static_scale
        c_lo = nvfp4_block_scale_codes(_block_amax(mag_lo, 16), s_enc).int()
        c_hi = nvfp4_block_scale_codes(_block_amax(mag_hi, 16), s_enc).int()
        below, above = [], []
        for d in range(int((c_hi - c_lo).max()) + 1 if c_hi.numel() else 1):
            c = torch.minimum(c_lo + d, c_hi).to(torch.uint8)
            below.append(qdq_nvfp4(lo, global_decode_scale=static_scale, block_scales=c))
            above.append(qdq_nvfp4(hi, global_decode_scale=static_scale, block_scales=c))
        return below, above


class _FP8(QuantizerKind):
    """The platform's FP8 (E4M3FN, or E4M3FNUZ on gfx942): the format comes with the checkpoint."""

    name = "fp8"

    def k_block(self, q) -> int:
        return q.block_shape[-1] if q.block_shape else 1

    def n_block(self, q) -> int:
        return q.block_shape[0] if q.block_shape else 1

    def code_format(self, q, fp8_format):
        return fp8_format

    def _granularity(self, q) -> str:
        return "per-tensor" if q.granularity is Granularity.PER_TENSOR else f"block{q.block_shape}"

    def weight_label(self, q) -> str:
        return f"fp8 {self._granularity(q)}"

    def act_label(self, q) -> str:
        return f"fp8 {self._granularity(q)} {'static' if q.static else 'dynamic'}"

    def per_tensor_scale(self, q) -> bool:
        return q.granularity is Granularity.PER_TENSOR

    def unit_scale(self, q):
        return 1.0

    def quantize_weight(self, q, w, convention, fp8_format):
        fq = quantize_fp8(w, fp8_format, granularity=q.granularity, block_shape=q.block_shape)
        return fq.codes, fq.scale, None

    def dequantize_weight(self, q, data, scale, global_scale, convention, fp8_format):
        return dequantize_fp8(data, scale, fp8_format)

    def weight_layout(self, q, e, n, k, fp8_format):
        if q.block_shape:
            bm, bk = q.block_shape
            return (e, n, k), torch.uint8, (e, n // bm, k // bk), torch.float32, None, f"{fp8_format.name} codes, fp32 block scales"
        return (e, n, k), torch.uint8, (e, 1, 1), torch.float32, None, f"{fp8_format.name} codes, one fp32 scale per expert"

    def random_weight(self, q, e, n, k, g, device, fp8_format):
        shape = (e, n // q.block_shape[0], k // q.block_shape[1]) if q.block_shape else (e, 1, 1)
        return _random_codes(fp8_format, (e, n, k), g, device), torch.full(shape, 0.01, device=device), None

    def qdq_activation(self, q, x, fp8_format, static_scale, scale_apply):
        if q.static:
            return qdq_fp8(x, fp8_format, scale=static_scale, scale_apply=scale_apply)
        return qdq_fp8(x, fp8_format, granularity=q.granularity, block_shape=q.block_shape)

    def calibrated_input_scale(self, amax, convention, fp8_format):
        return true_divide(amax, fp8_format.max_normal).float()

    def act_scale_group(self, q) -> int | None:
        if q.static:
            return 1
        return q.block_shape[1] if q.granularity is Granularity.PER_BLOCK and q.block_shape[0] == 1 else None

    def requantization_candidates(self, q, lo, hi, mag_lo, mag_hi, fp8_format, static_scale, scale_apply):
        fmax = fp8_format.max_normal
        if q.static:
            kw = dict(scale=static_scale, scale_apply=scale_apply)
            return [qdq_fp8(lo, fp8_format, **kw)], [qdq_fp8(hi, fp8_format, **kw)]
        if q.granularity is not Granularity.PER_BLOCK or q.block_shape[0] != 1:
            raise NotImplementedError(f"requantization candidates for {self.act_label(q)}")
        bk = q.block_shape[1]
        floor = torch.tensor(1.0 / (fmax * _MIN_SCALE_DIVISOR), dtype=torch.float32)
        s_lo = torch.clamp_min(true_divide(_block_amax(mag_lo, bk), fmax), floor)
        s_hi = torch.clamp_min(true_divide(_block_amax(mag_hi, bk), fmax), floor)
        kw = dict(granularity=q.granularity, block_shape=q.block_shape)
        qd = {(v, s): qdq_fp8(x, fp8_format, scale=sc, **kw)
              for v, x in (("lo", lo), ("hi", hi)) for s, sc in (("slo", s_lo), ("shi", s_hi))}
        # Between the two scales the code of an input may jump; every value a jump can produce lies within
        # one step (at the larger scale) of the input, so widen by that where the endpoint codes differ.
        step = _fp8_step(mag_hi, s_hi.repeat_interleave(bk, -1), fp8_format)
        per_lo, per_hi = s_lo.repeat_interleave(bk, -1), s_hi.repeat_interleave(bk, -1)
        jump_lo = qd[("lo", "slo")] / per_lo != qd[("lo", "shi")] / per_hi
        jump_hi = qd[("hi", "slo")] / per_lo != qd[("hi", "shi")] / per_hi
        env_lo = torch.where(jump_lo, lo.double() - step, torch.inf)
        env_hi = torch.where(jump_hi, hi.double() + step, -torch.inf)
        return [qd[("lo", "slo")], qd[("lo", "shi")], env_lo], [qd[("hi", "slo")], qd[("hi", "shi")], env_hi]


def _random_codes(fmt: FloatFormat, size, g: torch.Generator, device) -> torch.Tensor:
    """Finite codes of moderate magnitude in checkpoint layout: FP4 packed two per byte (every E2M1 code is
    finite), wider formats one per byte with the exponent field within 3 of the bias (no NaN, no Inf, no
    code above the format's range), random signs and mantissas."""
    e, n, k = size
    if fmt.nbits == 4:
        return torch.randint(0, 256, (e, n, k // 2), generator=g, device=device, dtype=torch.uint8)
    # uint8 throughout, in place: Kimi-K2's w13 alone is 11 G codes (int32 temporaries took 126 GB)
    top = (1 << fmt.ebits) - 1
    code = torch.randint(max(1, fmt.bias - 3), min(top, fmt.bias + 3) + 1, size, generator=g, device=device,
                         dtype=torch.uint8)
    code.bitwise_left_shift_(fmt.mbits)
    code.bitwise_or_(torch.randint(0, 1 << fmt.mbits, size, generator=g, device=device, dtype=torch.uint8))
    code.clamp_(max=fmt.max_code)
    sign = torch.randint(0, 2, size, generator=g, device=device, dtype=torch.uint8)
    return code.bitwise_or_(sign.bitwise_left_shift_(fmt.ebits + fmt.mbits))


def _fp8_step(mag: torch.Tensor, scale: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """The FP8 code spacing at |x| = mag under `scale` (a full step: it covers either neighbour), from the
    exponent bits (torch.frexp), never a floating log2."""
    y = (mag.double() / scale.double()).clamp(2.0**fmt.emin, fmt.max_normal)
    e = (torch.frexp(y).exponent - 1).clamp(min=fmt.emin)
    return torch.ldexp(torch.ones_like(y), e - fmt.mbits) * scale.double()


MX, NVFP4, FP8 = _MX(), _NVFP4(), _FP8()
QUANTIZER_KINDS = (MX, NVFP4, FP8)
