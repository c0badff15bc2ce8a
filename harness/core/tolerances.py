"""Typed tolerances and comparisons: Exact for quantizers, a derived per-element ErrorBound for MoE
outputs. No atol/rtol literal is guessed anywhere; every term below is a rounding-error fact.

The MoE bound (moe_error_bound) follows the reference trace stage by stage, for a kernel with the trace's
declared numerical structure (reference.structure) that gets the same inputs and quantizes activations
bit-exactly but may accumulate in any order in fp32, may feed its GEMMs bf16 operands where the
dequantized values are not exactly bf16 (derived from the data), and rounds where its structure says:
  GEMM      |h' - h| <= (2u_op + u_op^2 + gamma_{K+4} + e_acc) sum|w||a| + sum|w| d_a   (Higham 3.5),
            the first term replaced by its probabilistic form where tighter (gemm_error: ~lambda sqrt(K) u
            times the largest partial sum the kernel may form, failing with probability <= 2^-50 per output;
            partial sums bounded in K order unless the backend declares k_order "any": gemm_magnitudes), the
            last by weighed flips (_propagated)
            e_acc: 0 for fp32 accumulation; a backend whose hardware accumulator is narrower than fp32
            declares its relative error on sum|w||a| (Hopper's FP8 tensor cores: see torch_fp8)
            a router weight in the GEMM's epilogue scales this by |w| and adds one fp32 rounding
  rounding  the kernel's value lies in [rnd(pre - d), rnd(pre + d)] (rounding is monotone), so the
            deviation after a rounding point is that interval's reach from rnd(pre): zero wherever no
            rounding midpoint lies within d (bf16, fp16 or fp32, as the structure declares)
  activation phi(g) psi(u): |d phi| <= L d_g (L = sup|phi'|, derived numerically; RELU2: (2|g| + d_g) d_g),
            |d psi| <= d_u (clamps, tanh-scaling and +1 are 1-Lipschitz),
            |dy| <= |d phi| |psi| + |phi| |d psi| + |d phi| |d psi| + 2 * 64 u_fp32 (|phi| + |g|) |psi|
            (the last term: fp32 evaluation of exp/tanh/erf on both sides, 64 ulps of the formula's
            largest magnitude; above any libm or fast-math intrinsic's few-ulp error); with GATE_ROUNDED
            phi passes its own rounding point first
  re-quantization of a2: codes must match except where the kernel's input could lie across a rounding
            midpoint or a block-scale threshold; there the deviation is the widest quantized value over
            every input in [y - d_y, y + d_y] and every block scale those inputs can pick (computed with
            the reference quantizers at fixed scales), else 0
  top-k sum fp32: |o' - o| <= sum_k |w_k| d_z,k + gamma_k sum_k |w_k z_k|; SEQUENTIAL: each add is one more
            rounding point of the intermediate dtype, in top-k order
Comparisons hold NaN and Inf outputs to the reference's places and signs, and a zero whose bound is 0 to
its sign; a failure names the worst element relative to its bound, the bound-0 elements that differ, the
structure assumed and, given the float64 value with no rounding points, which side is closer to it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from harness.backends.base import K_ORDERS
from reference.checkpoints import MoECheckpoint
from reference.activations import gate_and_up
from reference.fp8 import ScaleApply
from reference.moe import MoETrace, RoutedWeights
from reference.schemes import ActQuant
from reference.structure import ActivationEval, Precision, RouterWeight, TopKSum, round_to

__all__ = [
    "U_BF16",
    "U_FP32",
    "gamma",
    "Exact",
    "ErrorBound",
    "Comparison",
    "Worst",
    "compare",
    "bf16_ulp",
    "moe_error_bound",
    "requantization_deviation",
    "gemm_error",
    "gemm_magnitudes",
    "GemmMagnitudes",
    "K_ORDERS",
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
    derivation: str = "moe_error_bound: forward error of each stage (see harness.core.tolerances)"
    # an upper bound on the probability that a correct kernel exceeds the bound somewhere (the probabilistic GEMM
    # terms: GEMM_FAILURE_PROBABILITY per GEMM output and per Hoeffding sum); 0 for a worst-case bound
    false_alarm: float = 0.0

    def to(self, device) -> "ErrorBound":
        return dataclasses.replace(self, bound=self.bound.to(device))


@dataclass
class Worst:
    """One element of a failed comparison, described for whoever must fix the kernel."""

    index: tuple[int, ...]
    expected: float
    got: float
    bound: float
    ulps: float  # |got - expected| in bf16 ulps of the larger of |expected| and |got| (never of a zero)
    exact: float | None = None  # the float64 value with no rounding points (the same structure), if computed

    def describe(self) -> str:
        diff = abs(self.got - self.expected)
        if not math.isfinite(diff):  # NaN or Inf against a finite value: no distance to report
            return f"index {self.index}: expected {self.expected!r}, got {self.got!r}"
        text = (f"index {self.index}: expected {self.expected!r}, got {self.got!r}, |diff| = {diff:.6g} = "
                f"{self.ulps:.1f} bf16 ulp")
        if self.bound > 0:
            text += f", {diff / self.bound:.3g}x its bound {self.bound:.6g}"
        if self.exact is not None and math.isfinite(self.exact):
            unit = float(bf16_ulp(torch.tensor(self.exact)))
            k_err, r_err = abs(self.got - self.exact) / unit, abs(self.expected - self.exact) / unit
            side = ("the kernel is closer" if k_err < r_err else "the reference is closer" if r_err < k_err
                    else "both equally far")
            text += (f"; exact value (float64, no rounding points) {self.exact!r}: kernel {k_err:.2f} ulp from it, "
                     f"reference {r_err:.2f} ulp: {side}")
        return text


def describe_fits(fits) -> str:
    """The failure message's line on the structures the output conforms to (harness.core.structure_fit)."""
    if not fits:
        return ("  conforms to no known structure on this case (none of the built-in structures, nor any one-field "
                "change of the declared one): a deviation, not a declaration")
    more = f" (also fits: {'; '.join(fits[1:4])}{' ...' if len(fits) > 4 else ''})" if len(fits) > 1 else ""
    return f"  conforms to {len(fits)} other structure(s) on this case: declare {fits[0]}{more}"


@dataclass
class Comparison:
    ok: bool
    what: str  # e.g. "w_mxfp4/SILU/torch_emulation/cpu: output"
    n_bad: int
    n_total: int
    worst_index: tuple[int, ...] | None = None  # the failing element with the largest |diff| / bound
    expected: float | None = None
    got: float | None = None
    bound: float | None = None
    ulps: float | None = None  # |got - expected| in bf16 ulps (of the larger magnitude), at the worst index
    max_ratio: float = 0.0  # max |got - expected| / bound (<= 1 passes)
    worst_ulps: float = 0.0  # max |got - expected| in bf16 ulps of expected, outputs >= 2^-8 of the largest
    # counts of |got - expected| / bound per element: [exact, < 2^RATIO_LOG2_MIN, one per binade
    # 2^RATIO_LOG2_MIN .. 2^RATIO_LOG2_MAX, >= 2^RATIO_LOG2_MAX (or bound 0 and a difference)]
    ratio_histogram: tuple[int, ...] = ()
    n_exact_required: int = 0  # elements whose bound is 0 (or whose expected value is NaN/Inf)
    n_exact_differ: int = 0  # ... and that differ
    worst: Worst | None = None  # the failing element with a nonzero bound and the largest |diff| / bound
    worst_exact: Worst | None = None  # the bound-0 element that differs most, in ulps
    structure: str | None = None  # the numerical structure the reference and bound assumed (label)
    n_nonfinite: int = 0  # NaN or Inf where the reference is finite
    false_alarm: float = 0.0  # the bound's probability of failing a correct kernel (ErrorBound.false_alarm)
    # on failure, when diagnosed: how to declare each other structure the output conforms to (harness.core.
    # structure_fit); () = none fits; None = not diagnosed
    structure_fits: tuple[str, ...] | None = None

    def message(self) -> str:
        if self.ok:
            return f"{self.what}: ok ({self.n_total} elements, worst error {self.max_ratio:.3g} of its bound)"
        if self.worst is None and self.worst_exact is None:
            return f"{self.what}: mismatch"
        parts = [f"{self.what}: {self.n_bad} of {self.n_total} elements out of bound"]
        if self.worst is not None and math.isfinite(self.worst.ulps) and math.isfinite(self.max_ratio_bounded):
            parts.append(f"worst {self.worst.ulps:.1f} ulp = {self.max_ratio_bounded:.3g}x its bound")
        elif self.worst is not None:  # a NaN or Inf where a finite value was expected: no ulp count means anything
            parts.append(f"worst: got {self.worst.got!r} where {self.worst.expected!r} was expected")
        if self.n_nonfinite:
            parts.append(f"{self.n_nonfinite} NaN/Inf where the reference is finite")
        if self.n_exact_differ:
            parts.append(f"{self.n_exact_differ} of the {self.n_exact_required} elements that must match exactly "
                         f"differ (worst {self.worst_exact.ulps:.1f} ulp)")
        if self.structure_fits is not None:
            parts.append(f"conforms to {self.structure_fits[0]}" if self.structure_fits else
                         "conforms to no known structure")
        lines = ["; ".join(parts)]
        if self.worst is not None:
            lines.append(f"  worst relative to its bound: {self.worst.describe()}")
        if self.worst_exact is not None:
            lines.append(f"  worst that must match exactly: {self.worst_exact.describe()}")
            lines.append("  (a bound of 0 means no rounding midpoint lies within the error a correct kernel can "
                         "accumulate before the last rounding: every correct kernel of this structure rounds to the "
                         "reference's value there; NaN and Inf outputs must match in place and sign)")
        if self.structure:
            lines.append(f"  the reference and bound assumed the declared structure {self.structure}")
        if self.structure_fits is not None:
            lines.append(describe_fits(self.structure_fits))
        return "\n".join(lines)

    @property
    def max_ratio_bounded(self) -> float:
        w = self.worst
        return abs(w.got - w.expected) / w.bound if w is not None and w.bound > 0 else 0.0


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


def _special_mismatch(expected: torch.Tensor, got: torch.Tensor) -> torch.Tensor:
    """Where NaN/Inf or signed zeros decide: NaN must meet NaN, +-Inf the same Inf, a zero the same
    signed zero where no deviation is allowed. True where `got` breaks that."""
    e, g = expected.double(), got.double()
    nan_e, nan_g = torch.isnan(e), torch.isnan(g)
    inf_e = torch.isinf(e)
    return (nan_e & ~nan_g) | (inf_e & (g != e)) | (~nan_e & nan_g)


def compare(expected: torch.Tensor, got: torch.Tensor, tolerance: Exact | ErrorBound, what: str,
            structure=None, exact: torch.Tensor | None = None) -> Comparison:
    """Compare and describe; the caller asserts on .ok with .message(). `structure`: the numerical
    structure the reference assumed (named in the message); `exact`: the float64 value with no rounding
    points, to say at the worst elements whether the kernel or the reference is closer to it."""
    label = getattr(structure, "label", structure)
    if tuple(got.shape) != tuple(expected.shape):
        return Comparison(False, f"{what} (shape {tuple(got.shape)} != expected {tuple(expected.shape)})",
                          expected.numel(), expected.numel(), structure=label)
    diff = (got.double() - expected.double()).abs()
    if isinstance(tolerance, Exact):
        e_bits, g_bits = _bytes(expected), _bytes(got.to(expected.dtype))
        bad = (e_bits != g_bits).any(-1) if expected.numel() else torch.zeros(0, dtype=torch.bool)
        bound = torch.zeros_like(diff)
    else:
        bound = tolerance.bound.double()
        special = ~torch.isfinite(expected.double())
        bound = torch.where(special, 0.0, torch.nan_to_num(bound, nan=0.0))
        zero_exact = (expected.double() == 0) & (bound == 0)
        sign_flip = zero_exact & (torch.signbit(expected.double()) != torch.signbit(got.double()))
        bad = torch.where(special, _special_mismatch(expected, got), ~(diff <= bound) | sign_flip)
        diff = torch.where(special & ~bad, 0.0, torch.where(special, torch.inf, diff))
        diff = torch.where(sign_flip, torch.inf, diff)
    n_bad = int(bad.sum())
    ratio = torch.where(bound > 0, diff / bound, torch.where(diff > 0, torch.inf, 0.0))
    ratio = torch.where(torch.isnan(ratio), torch.inf, ratio)
    max_ratio = float(ratio.max()) if ratio.numel() else 0.0
    finite = torch.isfinite(expected.double())
    worst_ulps = _worst_ulps(expected[finite], diff[finite]) if bool(finite.any()) else 0.0
    if not bool(finite.all()) and bool(bad[~finite].any()):
        worst_ulps = float("inf")
    required = bound == 0
    extra = dict(max_ratio=max_ratio, worst_ulps=worst_ulps, ratio_histogram=ratio_histogram(ratio),
                 n_exact_required=int(required.sum()), n_exact_differ=int((required & bad).sum()), structure=label,
                 n_nonfinite=int((finite & ~torch.isfinite(got.double())).sum()),
                 false_alarm=getattr(tolerance, "false_alarm", 0.0))
    if n_bad == 0:
        return Comparison(True, what, 0, expected.numel(), **extra)

    def describe(flat: int) -> Worst:
        idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), expected.shape))
        e_v, g_v = float(expected[idx]), float(got[idx])
        d = abs(g_v - e_v)
        unit = float(bf16_ulp(torch.tensor(max(abs(e_v), abs(g_v))))) if math.isfinite(d) else 1.0
        ulps = d / unit if math.isfinite(e_v) and math.isfinite(d) else float("inf")
        return Worst(idx, e_v, g_v, float(bound[idx]), ulps, None if exact is None else float(exact[idx]))

    bounded_bad = bad & ~required
    worst = describe(int(torch.argmax(torch.where(bounded_bad, ratio, -1.0)))) if bool(bounded_bad.any()) else None
    larger = torch.maximum(expected.double().abs(), torch.nan_to_num(got.double().abs(), nan=0.0, posinf=0.0))
    ulp_dist = torch.where(finite, diff / bf16_ulp(larger), torch.inf)
    exact_bad = bad & required
    worst_exact = (describe(int(torch.argmax(torch.where(exact_bad, ulp_dist, -1.0))))
                   if bool(exact_bad.any()) else None)
    head = worst or worst_exact
    return Comparison(
        False, what, n_bad, expected.numel(), head.index, head.expected, head.got, head.bound, head.ulps,
        worst=worst, worst_exact=worst_exact, **extra,
    )


# ---- the MoE bound -----------------------------------------------------------------------------


def _operand_unit(values: torch.Tensor | RoutedWeights, unit: float) -> float:
    """`unit` if these GEMM operands are not all exactly bf16 (a kernel may round them to its operand
    type, or apply their scales to partial sums instead of to each operand), else 0."""
    if isinstance(values, RoutedWeights):  # a real model's routed experts, dequantized one at a time
        return 0.0 if values.exactly_bf16() else unit
    return 0.0 if bool((values.to(torch.bfloat16).double() == values).all()) else unit


def _through_rounding(d: torch.Tensor, pre: torch.Tensor, precision: Precision) -> torch.Tensor:
    """Deviation after a rounding point, both sides rounding to `precision`: the kernel's value lies in
    [rnd(pre - d), rnd(pre + d)] (rounding is monotone), the reference's is rnd(pre). Zero wherever no
    rounding midpoint lies within d of the value: rounding points mostly absorb small errors."""
    r = round_to(pre, precision)
    return torch.maximum(round_to(pre + d, precision) - r, r - round_to(pre - d, precision))


# The GEMM terms are probabilistic where that is tighter (Higham and Mary, "A new approach to probabilistic
# rounding error analysis", SIAM J. Sci. Comput. 41(5), 2019, Theorem 3.1 and its inner-product corollary):
# if an inner product's rounding errors delta_j (|delta_j| <= u_j) are independent with mean zero, its error is
# at most  expm1(lambda sqrt(sum u_j^2) + sum u_j^2 / (1 - u_j)) sum|w||a|  except with probability at most
# (number of roundings) * 2 exp(-lambda^2 (1 - u_max)^2 / 2). The worst case grows like K u, this like
# lambda sqrt(K) u. lambda is chosen per K so that the failure probability of one GEMM output is at most
# GEMM_FAILURE_PROBABILITY; a case's false-alarm probability is at most that times its GEMM outputs
# (gemm_outputs, reported per case). Round-to-nearest fp32 accumulation and operand conversion fit the model;
# a hardware accumulator that truncates or keeps fewer bits is systematic, so the backend declares it
# (accumulation_error) and it is added in full, never averaged away.
GEMM_FAILURE_PROBABILITY = 2.0**-50
# The failure probabilities at which the re-quantization deviations are also computed, to weigh each possible
# flip by how likely a correct kernel is to make it (_propagated); the last is GEMM_FAILURE_PROBABILITY.
FLIP_LEVELS = (2.0**-2, 2.0**-5, 2.0**-10, 2.0**-20, GEMM_FAILURE_PROBABILITY)


def probabilistic_lambda(n_roundings: int, u_max: float, p: float = GEMM_FAILURE_PROBABILITY) -> float:
    """lambda with n_roundings * 2 exp(-lambda^2 (1 - u_max)^2 / 2) = p (Higham and Mary's failure probability)."""
    return math.sqrt(2 * math.log(2 * n_roundings / p)) / (1 - u_max)


# The K order the bound assumes unless a backend declares otherwise (k_order): every partial sum the kernel forms
# covers a contiguous range of K, give or take parts of the aligned K_CHUNK-element chunks at its two ends. True of
# tiled K loops (any tile width), of a matrix instruction's own adder tree (its K step of 16 or 32 lies inside
# one chunk), and of split-K whose partial results are added in K order. Then |partial sum| <= the range of the
# prefix sums at chunk boundaries plus two chunks' sum|w||a|: for random-sign data ~sqrt(K) times a typical
# product, where sum|w||a| is ~K times it. k_order "any" (split-K reduced by atomics in any order, a K-permuted
# weight layout) bounds every partial sum by sum|w||a| itself.
K_CHUNK = 32
MMA_K_STEP = 16  # the K width of one matrix-unit accumulation step (accumulation_truncation counts them)
_SLAB = 1 << 24  # float64 elements per (chunk, row, output) slab: bounds the memory of the ordered magnitudes


@dataclass(frozen=True)
class GemmMagnitudes:
    """Per GEMM output, what its rounding errors are relative to: abs_sum = sum|w||a| (+|bias|), partial = a bound
    on every partial sum the kernel may form (k_order), square_sum = sum (w a)^2 (the products' own roundings)."""

    abs_sum: torch.Tensor
    partial: torch.Tensor
    square_sum: torch.Tensor


def gemm_magnitudes(w: torch.Tensor, a: torch.Tensor, bias=None, k_order: str = "ordered") -> GemmMagnitudes:
    """GemmMagnitudes of a @ w.T (float64 operands: the reference's dequantized values)."""
    if k_order not in K_ORDERS:
        raise ValueError(f"k_order must be one of {K_ORDERS}, got {k_order!r}")
    b_abs = bias.abs() if bias is not None else 0.0
    square_sum = (a * a) @ (w * w).T
    if k_order == "any":
        abs_sum = a.abs() @ w.abs().T + b_abs
        return GemmMagnitudes(abs_sum, abs_sum, square_sum)
    k = a.shape[-1]
    pad = (-k) % K_CHUNK
    chunks = (k + pad) // K_CHUNK
    a_c = torch.nn.functional.pad(a, (0, pad)).reshape(-1, chunks, K_CHUNK).transpose(0, 1)  # [chunk, row, C]
    w_c = torch.nn.functional.pad(w, (0, pad)).reshape(-1, chunks, K_CHUNK).permute(1, 2, 0)  # [chunk, C, out]
    abs_sum, partial = [], []
    step = max(1, _SLAB // max(1, chunks * w.shape[0]))
    for r in range(0, a.shape[0], step):
        part = torch.bmm(a_c[:, r:r + step], w_c)
        part_abs = torch.bmm(a_c[:, r:r + step].abs(), w_c.abs())
        prefix = part.cumsum(0)
        reach = prefix.amax(0).clamp_min(0) - prefix.amin(0).clamp_max(0)  # prefix 0 is the empty sum
        abs_sum.append(part_abs.sum(0))
        partial.append(reach + 2 * part_abs.amax(0))
    abs_sum = torch.cat(abs_sum) + b_abs
    # a bias added first shifts every partial sum by it
    return GemmMagnitudes(abs_sum, torch.minimum(torch.cat(partial) + b_abs, abs_sum), square_sum)


def gemm_error(k: int, mags: GemmMagnitudes, u_op: float, p: float = GEMM_FAILURE_PROBABILITY,
               truncation: float = 0.0) -> torch.Tensor:
    """A bound on |computed - exact| for GEMM outputs of k products computed in fp32 (any summation order that
    k_order allows) from operands each possibly rounded with unit u_op, plus a bias and up to three scale
    multiplications, that holds except with probability p per output. Round-to-nearest: the smallest of
      worst case (Higham 3.5)  (2 u_op + u_op^2 + gamma_{k+4}) sum|w||a|
      Higham and Mary          expm1(lambda sqrt(sum u_j^2) + sum u_j^2 / (1 - u_j)) sum|w||a|,
                               p = n 2 exp(-lambda^2 (1 - u)^2 / 2)
      Azuma                    the error is exactly sum_j c_j delta_j over the fp32 roundings and the operand
                               roundings: the k + 4 adds and scalings have c_j a computed partial sum, |c_j| <=
                               partial + gamma_{2k+4} sum|w||a|; the k products and the 2k operand roundings have
                               c_j = (1 + u) w a, whose squares sum to square_sum; mean-zero deltas make it a
                               martingale: p = 2 exp(-t^2 / (2 sum c_j^2 u_j^2))
    (Higham and Mary's union over the n terms costs little at small p; Azuma's has none). An accumulator that
    loses up to `truncation` of the running sum toward zero at each MMA_K_STEP of K is not mean-zero: that adds
    truncation * ceil(k / MMA_K_STEP) * partial, in full."""
    worst = 2 * u_op + u_op * u_op + gamma(k + 4)
    units = [(U_FP32, k + 4)] + ([(u_op, 2)] if u_op > 0 else [])  # (unit, how many roundings of it)
    lam = probabilistic_lambda(sum(n for _, n in units), max(v for v, _ in units), p)
    spread = math.sqrt(sum(n * v * v for v, n in units))
    drift = sum(n * v * v / (1 - v) for v, n in units)
    relative = min(worst, math.expm1(lam * spread + drift))
    partial = mags.partial + gamma(2 * k + 4) * mags.abs_sum
    variance = (U_FP32**2 * ((k + 4) * partial * partial + (1 + U_FP32) ** 2 * mags.square_sum)
                + 2 * (u_op * (1 + u_op)) ** 2 * mags.square_sum)
    # + the operand roundings' second-order products (delta_w delta_a w a), in full
    azuma = math.sqrt(2 * math.log(2 / p)) * torch.sqrt(variance) + u_op * u_op * mags.abs_sum
    return torch.minimum(relative * mags.abs_sum, azuma) + truncation * math.ceil(k / MMA_K_STEP) * mags.partial


def gemm_relative_error(k: int, u_op: float, p: float = GEMM_FAILURE_PROBABILITY) -> float:
    """gemm_error relative to sum|w||a| whatever the data (partial sums and products as large as sum|w||a|)."""
    one = torch.ones((), dtype=torch.float64)
    return float(gemm_error(k, GemmMagnitudes(one, one, one), u_op, p))


def _gemm_bound(k: int, mags: GemmMagnitudes, u_op: float, e_acc: float, trunc: float, p: float) -> torch.Tensor:
    """gemm_error, plus e_acc sum|w||a| for a narrower accumulator and trunc times the largest partial sum for each
    K step of an accumulator that truncates (both systematic: in full), and the reference's own float64
    accumulation (gamma_{K+1})."""
    return gemm_error(k, mags, u_op, p, trunc) + (e_acc + gamma(k + 1, U_FP64)) * mags.abs_sum


def _propagated(levels: list[torch.Tensor], w_abs: torch.Tensor, group: int | None, feeds: int) -> torch.Tensor:
    """Bound on |sum_j w_ij (a2'_j - a2_j)| over a GEMM2 output i, from the kernel's input deviations.
    levels[m]: a bound on |a2'_j - a2_j| that fails with probability at most feeds * FLIP_LEVELS[m]. Worst
    case: sum_j |w_ij| D_j (D the last level). Most D_j are whole re-quantization steps that a correct kernel
    takes only if its GEMM1 error lands across a rounding midpoint, which the lower levels say is unlikely; the
    deviations of different scale groups come from different GEMM1 outputs, independent under the rounding
    model. So, truncated at D (failure counted in the false-alarm probability), X_g = sum_{j in g} |w_ij|
    |a2'_j - a2_j| are independent in [0, b_g = sum_{j in g} |w_ij| D_j] with mean at most sum_{j in g} |w_ij|
    E_j, E_j = integral of P(|a2'_j - a2_j| > t) over [0, D_j] <= D_0 + sum_m min(1, feeds p_{m-1}) (D_m -
    D_{m-1}) (the layer cake), and Hoeffding's inequality gives sum_g X_g <= sum_g E[X_g] + sqrt(ln(1/p) / 2
    sum_g b_g^2) except with probability p = GEMM_FAILURE_PROBABILITY. A row that shares one dynamic scale
    (group None) has no independent parts: worst case."""
    top = levels[-1]
    worst = top @ w_abs.T
    if group is None:
        return worst
    mean = levels[0].clone()
    for m in range(1, len(levels)):
        mean += min(1.0, feeds * FLIP_LEVELS[m - 1]) * (levels[m] - levels[m - 1])
    rows, n = top.shape
    if group == 1:
        squares = (top * top) @ (w_abs * w_abs).T
    else:  # per (row, output, group) the range b_g; the groups are consecutive blocks of `group` elements along n
        ranges = torch.einsum("rgj,igj->rig", top.reshape(rows, n // group, group),
                              w_abs.reshape(-1, n // group, group))
        squares = (ranges * ranges).sum(-1)
    spread = torch.sqrt(math.log(1 / GEMM_FAILURE_PROBABILITY) / 2 * squares)
    return torch.minimum(worst, mean @ w_abs.T + spread)


def _widen_fp32(x64: torch.Tensor, direction: float) -> torch.Tensor:
    """fp32 value at or beyond x64 in `direction` (-inf: at most x64; +inf: at least x64)."""
    x32 = x64.float()
    inward = (x32.double() > x64) if direction < 0 else (x32.double() < x64)
    return torch.where(inward, torch.nextafter(x32, torch.full_like(x32, direction)), x32)


def requantization_deviation(
    y: torch.Tensor, d_y: torch.Tensor, q_ref: torch.Tensor, aq: ActQuant, ckpt: MoECheckpoint, static_scale,
    static_scale_apply: ScaleApply = ScaleApply.DIVIDE,
) -> torch.Tensor:
    """Largest |Q(y') - q_ref| over y' in [y - d_y, y + d_y] (elementwise, any block scale those inputs can
    produce). Zero where the quantized value cannot change."""
    lo = _widen_fp32(y - d_y, float("-inf"))
    hi = _widen_fp32(y + d_y, float("inf"))
    mag_lo = torch.clamp_min(torch.minimum(lo.abs(), hi.abs()) * ((lo > 0) | (hi < 0)), 0.0)  # |y'| lower bound
    mag_hi = torch.maximum(lo.abs(), hi.abs())
    candidates_lo, candidates_hi = aq.kind.requantization_candidates(aq, lo, hi, mag_lo, mag_hi, ckpt.fp8_format,
                                                                     static_scale, static_scale_apply)
    q_min = torch.stack(candidates_lo).double().amin(0)
    q_max = torch.stack(candidates_hi).double().amax(0)
    return torch.maximum(q_max - q_ref, q_ref - q_min).clamp_min(0.0)


def moe_error_bound(trace: MoETrace, ckpt: MoECheckpoint, operand_dtype: torch.dtype = torch.float32,
                    accumulation_error: float = 0.0, accumulation_truncation: float = 0.0,
                    k_order: str = "ordered") -> ErrorBound:
    """Per-element bound on |kernel output - reference output| (both bf16), from the reference trace, for a
    kernel with the trace's numerical structure (trace.structure: its rounding points, where it applies the
    router weight, how it evaluates the activation and sums the top-k terms).

    operand_dtype: what the kernel feeds its GEMMs. float32: operands are the reference's fp32 values,
    or code values with their scales applied to fp32 partial sums (an fp32 rounding's worth of
    difference, u_fp32). bfloat16: the kernel may round dequantized weights/activations to bf16, which
    costs u_bf16 per operand. Either way only where the operands are not exactly bf16 (decided from the
    data: MX values always are; NVFP4 and FP8 values times fp32 scales are not).
    accumulation_error: what the kernel's GEMM accumulation may add to fp32 accumulation's error, relative
    to sum|w||a|: 0 for an fp32 accumulator; a backend on a narrower hardware accumulator declares it.
    accumulation_truncation: what a truncating accumulator may lose at each MMA_K_STEP of K, relative to the running
    sum (0 for round-to-nearest).
    k_order: "ordered" (default) or "any": which partial sums the kernel may form (K_ORDERS, gemm_magnitudes)."""
    if operand_dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"operand_dtype must be float32 or bfloat16, got {operand_dtype}")
    if not 0.0 <= accumulation_error < 1:
        raise ValueError(f"accumulation_error must be in [0, 1), got {accumulation_error!r}")
    if not 0.0 <= accumulation_truncation < 1:
        raise ValueError(f"accumulation_truncation must be in [0, 1), got {accumulation_truncation!r}")
    trunc = accumulation_truncation
    e_acc = accumulation_error
    st = trace.structure
    rw = st.router_weight
    act, aq = ckpt.activation, ckpt.scheme.act
    unit = U_BF16 if operand_dtype == torch.bfloat16 else U_FP32
    u1 = max(_operand_unit(trace.w13, unit), _operand_unit(trace.a1, unit))
    u2 = max(_operand_unit(trace.w2, unit), _operand_unit(trace.a2, unit))
    group = 1 if aq is None else aq.kind.act_scale_group(aq)  # a2 elements that depend on each other
    feeds = (2 if act.gated else 1) * (group or 1)  # GEMM1 outputs each a2 element depends on
    d_z = torch.zeros_like(trace.z)
    for i, e in enumerate(trace.experts.tolist()):
        rows = (trace.pair_expert == e).nonzero().flatten()
        w_abs = trace.pair_weight[rows].abs()[:, None]
        a1 = trace.a1[trace.pair_token[rows]]
        b13 = ckpt.b13[e].double() if ckpt.b13 is not None else None
        mags1 = gemm_magnitudes(trace.w13[i], a1, b13, k_order)
        # d_a2 at every level at once (a leading dim): each holds except with probability feeds * p
        d_h = torch.stack([_gemm_bound(trace.w13.shape[-1], mags1, u1, e_acc, trunc, p) for p in FLIP_LEVELS])
        if rw is RouterWeight.GEMM1_EPILOGUE:  # w times the fp32 accumulator: one more fp32 rounding
            d_h = (1 + U_FP32) * w_abs * d_h + U_FP32 * trace.h_pre[rows].abs()
        d_h = _through_rounding(d_h, trace.h_pre[rows], st.gemm1_out)
        d_y = _activation_deviation(trace.h[rows], d_h, trace.phi_pre[rows], act, st)
        d_y = _through_rounding(d_y, trace.y_pre[rows], st.act_out)
        if aq is not None:
            d_y = requantization_deviation(trace.y[rows], d_y, trace.a2[rows], aq, ckpt, trace.a2_scale,
                                           st.fp8_static_scale)
        levels = list(torch.cummax(d_y, 0).values.unbind(0))
        b2 = ckpt.b2[e].double() if ckpt.b2 is not None else None
        w2_abs = trace.w2[i].abs()
        mags2 = gemm_magnitudes(trace.w2[i], trace.a2[rows], b2, k_order)
        dz = (_gemm_bound(trace.w2.shape[-1], mags2, u2, e_acc, trunc, GEMM_FAILURE_PROBABILITY)
              + _propagated(levels, w2_abs, group, feeds))
        if rw is RouterWeight.GEMM2_EPILOGUE:
            dz = (1 + U_FP32) * w_abs * dz + U_FP32 * trace.z_pre[rows].abs()
        d_z[rows] = _through_rounding(dz, trace.z_pre[rows], st.gemm2_out)
    (t, hsz), k = trace.out.shape, trace.top_k
    weighted_here = rw is RouterWeight.AFTER_GEMM2_ROUNDING  # the sum multiplies w z itself, in fp32
    d_term = (trace.pair_weight.abs()[:, None] * d_z if weighted_here else d_z).reshape(t, k, hsz)
    term = trace.term.abs().reshape(t, k, hsz)
    if st.topk_sum.for_top_k(k) is TopKSum.SEQUENTIAL:
        # acc_j = rnd(acc_{j-1} + term_j) in top-k order: each add is one rounding, monotone in its input
        d = torch.zeros(t, hsz, dtype=torch.float64)
        for j in range(k):
            product = 2 * U_FP32 * term[:, j] if weighted_here else 0.0  # fl32(w z) and the fp32 add
            d = _through_rounding(d + d_term[:, j] + product, trace.acc_pre[:, j], st.gemm2_out)
    else:
        d = d_term.sum(1) + (gamma(k) + gamma(k, U_FP64)) * term.sum(1)
    # every GEMM1 output's top level, every GEMM2 output's rounding term and its Hoeffding sum (harness-generated
    # and real shapes alike: a case of 64 tokens at gpt-oss-120b's share is ~2^25 outputs, ~2^-25 per case)
    n1, n2 = trace.pair_expert.numel() * trace.w13.shape[1], trace.pair_expert.numel() * trace.w2.shape[1]
    return ErrorBound(_through_rounding(d, trace.out_pre, Precision.BF16),
                      false_alarm=min(1.0, (n1 + 2 * n2) * GEMM_FAILURE_PROBABILITY))


def _activation_deviation(h, d_h, phi_pre, act, st) -> torch.Tensor:
    """|y' - y_pre| before the act_out rounding, on the factors phi(gate) * psi(up) with h split the way the
    activation splits it; with GATE_ROUNDED the gate function passes its own rounding point first."""
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
    d_eval = 2 * EVAL_ULPS * U_FP32 * (phi.abs() + g.abs())
    if act.gated and st.activation_eval(act) is ActivationEval.GATE_ROUNDED:
        d_phi = _through_rounding(d_phi + d_eval, phi_pre, st.act_out)
        phi = round_to(phi_pre, st.act_out)
        d_eval = 2 * EVAL_ULPS * U_FP32 * phi.abs()  # psi's evaluation and the fp32 product
    else:
        d_phi = d_phi + d_eval
        d_eval = 0.0
    return d_phi * psi.abs() + phi.abs() * du + d_phi * du + d_eval * psi.abs()
