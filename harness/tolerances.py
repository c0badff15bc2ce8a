"""Typed tolerances and comparisons: Exact for quantizers, a derived per-element ErrorBound for MoE
outputs. No atol/rtol literal is guessed anywhere; every term below is a rounding-error fact.

The MoE bound (moe_error_bound) follows the reference trace stage by stage, for a kernel that gets the
same inputs and quantizes activations bit-exactly but may accumulate in any order in fp32, may feed its
GEMMs bf16 operands where the dequantized values are not exactly bf16 (derived from the data), and
rounds to bf16 at the scheme's rounding points:
  GEMM      |h' - h| <= (2u_op + u_op^2 + gamma_{K+4} + e_acc) sum|w||a| + sum|w| d_a   (Higham 3.5)
            e_acc: 0 for fp32 accumulation; a backend whose hardware accumulator is narrower than fp32
            declares its relative error on sum|w||a| (Hopper's FP8 tensor cores: see torch_fp8)
  rounding  |rnd(h') - rnd(h)| <= (1 + u) |h' - h| + 2u|h|(1 + u)                      u = 2^-8 for bf16
  activation phi(g) psi(u): |d phi| <= L d_g (L = sup|phi'|, derived numerically; RELU2: (2|g| + d_g) d_g),
            |d psi| <= d_u (clamps, tanh-scaling and +1 are 1-Lipschitz),
            |dy| <= |d phi| |psi| + |phi| |d psi| + |d phi| |d psi| + 2 * 64 u_fp32 (|phi| + |g|) |psi|
            (the last term: fp32 evaluation of exp/tanh/erf on both sides, 64 ulps of the formula's
            largest magnitude; above any libm or fast-math intrinsic's few-ulp error)
  re-quantization of a2: codes must match except where the kernel's input could lie across a rounding
            midpoint or a block-scale threshold; there the deviation is the widest quantized value over
            every input in [y - d_y, y + d_y] and every block scale those inputs can pick (computed with
            the reference quantizers at fixed scales), else 0
  top-k sum |o' - o| <= sum_k |w_k| d_z,k + gamma_k sum_k |w_k z_k|
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reference.checkpoints import MoECheckpoint
from reference.activations import gate_and_up
from reference.formats import FloatFormat
from reference.fp8 import Granularity, _MIN_SCALE_DIVISOR
from reference.moe import MoETrace, round_bf16
from reference.mx import ScaleMode, mx_shared_exponent, qdq_mx
from reference.nvfp4 import nvfp4_block_scale_codes, qdq_nvfp4
from reference.schemes import ActQuant

__all__ = [
    "U_BF16",
    "U_FP32",
    "gamma",
    "Exact",
    "ErrorBound",
    "Comparison",
    "compare",
    "bf16_ulp",
    "moe_error_bound",
    "requantization_deviation",
]

U_BF16 = 2.0**-8
U_FP32 = 2.0**-24
U_FP64 = 2.0**-53
EVAL_ULPS = 64


def gamma(n: int, u: float = U_FP32) -> float:
    """Higham's gamma_n = n u / (1 - n u): the relative bound of an n-term fp32 sum, any order."""
    if n * u >= 1:
        raise ValueError(f"gamma_{n} is undefined for u={u}: accumulation too long for this precision")
    return n * u / (1 - n * u)


def bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    """The spacing of bf16 numbers at |x| (the smallest bf16 subnormal spacing at 0)."""
    ax = x.double().abs()
    e = torch.floor(torch.log2(ax.clamp_min(2.0**-126)))
    return 2.0 ** (e - 7)


@dataclass(frozen=True)
class Exact:
    """Bit-exact: equal bit patterns (NaN payloads and signed zeros included)."""

    reason: str = "quantizers, dequantizers, packing and layouts are exact by definition"


@dataclass(frozen=True)
class ErrorBound:
    """A per-element bound |got - expected| <= bound, derived from the computation."""

    bound: torch.Tensor
    derivation: str = "moe_error_bound: forward error of each stage (see harness.tolerances)"


@dataclass
class Comparison:
    ok: bool
    what: str  # e.g. "w_mxfp4/SILU/torch_emulation: output"
    n_bad: int
    n_total: int
    worst_index: tuple[int, ...] | None = None
    expected: float | None = None
    got: float | None = None
    bound: float | None = None
    ulps: float | None = None  # |got - expected| in bf16 ulps of expected, at the worst index
    max_ratio: float = 0.0  # max |got - expected| / bound (<= 1 passes)
    worst_ulps: float = 0.0  # max |got - expected| in bf16 ulps of expected, outputs >= 2^-8 of the largest
    # counts of |got - expected| / bound per element: [exact, < 2^RATIO_LOG2_MIN, one per binade
    # 2^RATIO_LOG2_MIN .. 2^RATIO_LOG2_MAX, >= 2^RATIO_LOG2_MAX (or bound 0 and a difference)]
    ratio_histogram: tuple[int, ...] = ()

    def message(self) -> str:
        if self.ok:
            return f"{self.what}: ok ({self.n_total} elements, worst error {self.max_ratio:.3g} of its bound)"
        if self.worst_index is None:
            return f"{self.what}: mismatch"
        allowed = ("bound 0: must match exactly" if self.bound == 0
                   else f"bound {self.bound:.6g}, {self.max_ratio:.3g}x over")
        return (
            f"{self.what}: {self.n_bad} of {self.n_total} elements out of bound; worst at index {self.worst_index}: "
            f"expected {self.expected!r}, got {self.got!r}, |diff| = {abs(self.got - self.expected):.6g} "
            f"= {self.ulps:.1f} bf16 ulp ({allowed})"
        )


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """[..., itemsize] raw bytes of t (a fresh dense copy first: expanded or strided views have none)."""
    dense = t.new_empty(t.shape).copy_(t)
    return dense.view(torch.uint8).reshape(*t.shape, -1) if t.numel() else dense


RATIO_LOG2_MIN, RATIO_LOG2_MAX = -16, 4


def ratio_histogram(ratio: torch.Tensor) -> tuple[int, ...]:
    """Binned |got - expected| / bound (see Comparison.ratio_histogram)."""
    r = ratio.flatten().double()
    exact = int((r == 0).sum())
    nz = r[r > 0]
    b = torch.floor(torch.log2(nz)).clamp(RATIO_LOG2_MIN - 1, RATIO_LOG2_MAX) - (RATIO_LOG2_MIN - 1)
    counts = torch.bincount(b.long(), minlength=RATIO_LOG2_MAX - RATIO_LOG2_MIN + 2)
    return (exact, *map(int, counts.tolist()))


def _worst_ulps(expected: torch.Tensor, diff: torch.Tensor) -> float:
    """max |diff| in bf16 ulps of the expected value, over the elements that matter at the output's
    scale: |expected| >= 2^-8 max|expected| (below that, a difference far under one ulp of the large
    outputs reads as thousands of local ulps near zero; those elements are still judged by the bound)."""
    if not diff.numel():
        return 0.0
    e = expected.double()
    finite = torch.isfinite(e)
    if not bool(finite.all()):
        return float("inf") if bool((diff[~finite] > 0).any() | torch.isnan(diff[~finite]).any()) else 0.0
    big = e.abs() >= e.abs().max() * 2.0**-8
    ulps = torch.nan_to_num(diff[big] / bf16_ulp(e[big]), nan=torch.inf)
    return float(ulps.max()) if ulps.numel() else 0.0


def compare(expected: torch.Tensor, got: torch.Tensor, tolerance: Exact | ErrorBound, what: str) -> Comparison:
    """Compare and describe; the caller asserts on .ok with .message()."""
    if tuple(got.shape) != tuple(expected.shape):
        return Comparison(False, f"{what} (shape {tuple(got.shape)} != expected {tuple(expected.shape)})",
                          expected.numel(), expected.numel())
    if isinstance(tolerance, Exact):
        e_bits, g_bits = _bytes(expected), _bytes(got.to(expected.dtype))
        bad = (e_bits != g_bits).any(-1) if expected.numel() else torch.zeros(0, dtype=torch.bool)
        diff = (got.double() - expected.double()).abs()
        bound = torch.zeros_like(diff)
    else:
        diff = (got.double() - expected.double()).abs()
        bound = tolerance.bound.double()
        bad = ~(diff <= bound)  # NaN in got fails
    n_bad = int(bad.sum())
    ratio = torch.where(bound > 0, diff / bound, torch.where(diff > 0, torch.inf, 0.0))
    ratio = torch.where(torch.isnan(ratio), torch.inf, ratio)
    max_ratio = float(ratio.max()) if ratio.numel() else 0.0
    worst_ulps = _worst_ulps(expected, diff)
    extra = dict(max_ratio=max_ratio, worst_ulps=worst_ulps, ratio_histogram=ratio_histogram(ratio))
    if n_bad == 0:
        return Comparison(True, what, 0, expected.numel(), **extra)
    flat = int(torch.argmax(torch.where(bad, ratio, -1.0)))
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), expected.shape))
    exp_v, got_v = float(expected[idx]), float(got[idx])
    return Comparison(
        False, what, n_bad, expected.numel(), idx, exp_v, got_v, float(bound[idx]),
        float(diff[idx] / bf16_ulp(expected[idx])), **extra,
    )


# ---- the MoE bound -----------------------------------------------------------------------------


def _operand_unit(values: torch.Tensor, unit: float) -> float:
    """`unit` if these GEMM operands are not all exactly bf16 (a kernel may round them to its operand
    type, or apply their scales to partial sums instead of to each operand), else 0."""
    return 0.0 if bool((values.to(torch.bfloat16).double() == values).all()) else unit


def _through_rounding(d: torch.Tensor, pre: torch.Tensor, enabled: bool) -> torch.Tensor:
    """Deviation after a bf16 rounding point, both sides rounding: the kernel's value lies in
    [rnd(pre - d), rnd(pre + d)] (rounding is monotone), the reference's is rnd(pre). Zero wherever no
    rounding midpoint lies within d of the value: rounding points mostly absorb small errors."""
    if not enabled:
        return d
    r = round_bf16(pre)
    return torch.maximum(round_bf16(pre + d) - r, r - round_bf16(pre - d))


def _gemm_bound(w: torch.Tensor, a: torch.Tensor, d_a: torch.Tensor | None, bias, u_op: float, e_acc: float):
    """Per-output bound of a' @ w.T computed in fp32 (plus e_acc sum|w||a| for a narrower accumulator)
    from operands each possibly rounded with unit u_op (0 where the operands are exact), plus the
    reference's own float64 accumulation error. The sum has K products, the bias, and up to three scale
    multiplications per partial sum (activation, weight block or tensor scale, expert scale): gamma_{K+4}."""
    k = w.shape[-1]
    s = a.abs() @ w.abs().T
    if bias is not None:
        s = s + bias.abs()
    err = (2 * u_op + u_op * u_op + gamma(k + 4) + e_acc + gamma(k + 1, U_FP64)) * s
    if d_a is not None:
        err = err + d_a @ w.abs().T
    return err


def _widen_fp32(x64: torch.Tensor, direction: float) -> torch.Tensor:
    """fp32 value at or beyond x64 in `direction` (-inf: at most x64; +inf: at least x64)."""
    x32 = x64.float()
    inward = (x32.double() > x64) if direction < 0 else (x32.double() < x64)
    return torch.where(inward, torch.nextafter(x32, torch.full_like(x32, direction)), x32)


def _block_amax(a: torch.Tensor, block: int) -> torch.Tensor:
    return a.reshape(*a.shape[:-1], -1, block).amax(-1)


def requantization_deviation(
    y: torch.Tensor, d_y: torch.Tensor, q_ref: torch.Tensor, aq: ActQuant, ckpt: MoECheckpoint, static_scale
) -> torch.Tensor:
    """Largest |Q(y') - q_ref| over y' in [y - d_y, y + d_y] (elementwise, any block scale those inputs can
    produce). Zero where the quantized value cannot change."""
    lo = _widen_fp32(y - d_y, float("-inf"))
    hi = _widen_fp32(y + d_y, float("inf"))
    mag_lo = torch.clamp_min(torch.minimum(lo.abs(), hi.abs()) * ((lo > 0) | (hi < 0)), 0.0)  # |y'| lower bound
    mag_hi = torch.maximum(lo.abs(), hi.abs())
    candidates_lo, candidates_hi = [], []
    if aq.kind == "mx":
        e_lo = mx_shared_exponent(_block_amax(mag_lo, 32), aq.elem, ScaleMode.FLOOR)
        e_hi = mx_shared_exponent(_block_amax(mag_hi, 32), aq.elem, ScaleMode.FLOOR)
        for d in range(int((e_hi - e_lo).max()) + 1 if e_hi.numel() else 1):
            e = torch.minimum(e_lo + d, e_hi)
            candidates_lo.append(qdq_mx(lo, aq.elem, shared_exponent=e))
            candidates_hi.append(qdq_mx(hi, aq.elem, shared_exponent=e))
    elif aq.kind == "nvfp4":
        s_enc = 1.0 / static_scale
        c_lo = nvfp4_block_scale_codes(_block_amax(mag_lo, 16), s_enc).int()
        c_hi = nvfp4_block_scale_codes(_block_amax(mag_hi, 16), s_enc).int()
        for d in range(int((c_hi - c_lo).max()) + 1 if c_hi.numel() else 1):
            c = torch.minimum(c_lo + d, c_hi).to(torch.uint8)
            candidates_lo.append(qdq_nvfp4(lo, global_decode_scale=static_scale, block_scales=c))
            candidates_hi.append(qdq_nvfp4(hi, global_decode_scale=static_scale, block_scales=c))
    else:
        candidates_lo, candidates_hi = _fp8_candidates(lo, hi, mag_lo, mag_hi, aq, ckpt.fp8_format, static_scale)
    q_min = torch.stack(candidates_lo).double().amin(0)
    q_max = torch.stack(candidates_hi).double().amax(0)
    return torch.maximum(q_max - q_ref, q_ref - q_min).clamp_min(0.0)


def _fp8_candidates(lo, hi, mag_lo, mag_hi, aq: ActQuant, fmt: FloatFormat, static_scale):
    from reference.fp8 import qdq_fp8

    fmax = fmt.max_normal
    if aq.static:
        return [qdq_fp8(lo, fmt, scale=static_scale)], [qdq_fp8(hi, fmt, scale=static_scale)]
    if aq.granularity is not Granularity.PER_BLOCK or aq.block_shape[0] != 1:
        raise NotImplementedError(f"requantization bound for {aq.label}")
    bk = aq.block_shape[1]
    floor = torch.tensor(1.0 / (fmax * _MIN_SCALE_DIVISOR), dtype=torch.float32)
    s_lo = torch.clamp_min(_block_amax(mag_lo, bk) / fmax, floor)
    s_hi = torch.clamp_min(_block_amax(mag_hi, bk) / fmax, floor)
    kw = dict(granularity=aq.granularity, block_shape=aq.block_shape)
    q = {(v, s): qdq_fp8(x, fmt, scale=sc, **kw) for v, x in (("lo", lo), ("hi", hi)) for s, sc in (("slo", s_lo), ("shi", s_hi))}
    # Between the two scales the code of an input may jump; every value a jump can produce lies within
    # half a step (at the larger scale) of the input, so widen by that where the endpoint codes differ.
    half_step = _fp8_half_step(mag_hi, s_hi.repeat_interleave(bk, -1), fmt)
    jump_lo = q[("lo", "slo")] / s_lo.repeat_interleave(bk, -1) != q[("lo", "shi")] / s_hi.repeat_interleave(bk, -1)
    jump_hi = q[("hi", "slo")] / s_lo.repeat_interleave(bk, -1) != q[("hi", "shi")] / s_hi.repeat_interleave(bk, -1)
    env_lo = torch.where(jump_lo, lo.double() - half_step, torch.inf)
    env_hi = torch.where(jump_hi, hi.double() + half_step, -torch.inf)
    return [q[("lo", "slo")], q[("lo", "shi")], env_lo], [q[("hi", "slo")], q[("hi", "shi")], env_hi]


def _fp8_half_step(mag: torch.Tensor, scale: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    y = (mag.double() / scale.double()).clamp(2.0**fmt.emin, fmt.max_normal)
    e = torch.floor(torch.log2(y)).clamp(min=fmt.emin)
    return 2.0 ** (e - fmt.mbits) * scale.double()  # a full step: covers rounding of the log2 estimate


def moe_error_bound(trace: MoETrace, ckpt: MoECheckpoint, operand_dtype: torch.dtype = torch.float32,
                    accumulation_error: float = 0.0) -> ErrorBound:
    """Per-element bound on |kernel output - reference output| (both bf16), from the reference trace.

    operand_dtype: what the kernel feeds its GEMMs. float32: operands are the reference's fp32 values,
    or code values with their scales applied to fp32 partial sums (an fp32 rounding's worth of
    difference, u_fp32). bfloat16: the kernel may round dequantized weights/activations to bf16, which
    costs u_bf16 per operand. Either way only where the operands are not exactly bf16 (decided from the
    data: MX values always are; NVFP4 and FP8 values times fp32 scales are not).
    accumulation_error: what the kernel's GEMM accumulation may add to fp32 accumulation's error, relative
    to sum|w||a|: 0 for an fp32 accumulator; a backend on a narrower hardware accumulator declares it."""
    if operand_dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"operand_dtype must be float32 or bfloat16, got {operand_dtype}")
    if not 0.0 <= accumulation_error < 1:
        raise ValueError(f"accumulation_error must be in [0, 1), got {accumulation_error!r}")
    e_acc = accumulation_error
    scheme, act, aq = ckpt.scheme, ckpt.activation, ckpt.scheme.act
    rnd = scheme.rounding
    unit = U_BF16 if operand_dtype == torch.bfloat16 else U_FP32
    u1 = max(_operand_unit(trace.w13, unit), _operand_unit(trace.a1, unit))
    u2 = max(_operand_unit(trace.w2, unit), _operand_unit(trace.a2, unit))
    d_z = torch.zeros_like(trace.z)
    for e in trace.pair_expert.unique().tolist():
        rows = (trace.pair_expert == e).nonzero().flatten()
        a1 = trace.a1[trace.pair_token[rows]]
        b13 = ckpt.b13[e].double() if ckpt.b13 is not None else None
        d_h = _through_rounding(_gemm_bound(trace.w13[e], a1, None, b13, u1, e_acc), trace.h_pre[rows], rnd.gemm1_out)
        h = trace.h[rows]
        # activation, on the factors phi(gate) * psi(up) with h split the way the activation splits it
        phi, psi = gate_and_up(h, act)
        if act.gated:
            n = h.shape[-1] // 2
            g, dg, du = (h[..., 0::2], d_h[..., 0::2], d_h[..., 1::2]) if act.interleaved else (
                h[..., :n], d_h[..., :n], d_h[..., n:])
        else:
            g, dg, du = h, d_h, torch.zeros_like(d_h)
        lip = act.gate_lipschitz
        d_phi = (2 * g.abs() + dg) * dg if lip is None else lip * dg
        # both the kernel's and the reference's fp32 evaluations err by up to EVAL_ULPS of the larger of
        # |phi| and |g| (the |g| covers the cancellation in 1 + tanh / 1 + erf for large negative g)
        d_eval = 2 * EVAL_ULPS * U_FP32 * (phi.abs() + g.abs()) * psi.abs()
        d_y = d_phi * psi.abs() + phi.abs() * du + d_phi * du + d_eval
        d_y = _through_rounding(d_y, trace.y_pre[rows], rnd.act_out)
        y = trace.y[rows]
        if aq is None:
            d_a2 = d_y
        else:
            d_a2 = requantization_deviation(y, d_y, trace.a2[rows], aq, ckpt, trace.a2_scale)
        b2 = ckpt.b2[e].double() if ckpt.b2 is not None else None
        dz = _gemm_bound(trace.w2[e], trace.a2[rows], d_a2, b2, u2, e_acc)
        d_z[rows] = _through_rounding(dz, trace.z_pre[rows], rnd.gemm2_out)
    (t, hsz), k = trace.out.shape, trace.top_k
    w = trace.pair_weight.abs()[:, None]
    d_out = (w * d_z).reshape(t, k, hsz).sum(1) + (gamma(k) + gamma(k, U_FP64)) * (w * trace.z.abs()).reshape(t, k, hsz).sum(1)
    return ErrorBound(_through_rounding(d_out, trace.out_pre, rnd.output))
