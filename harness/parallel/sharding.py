"""Tensor and expert parallelism as data: how a serving engine splits one MoE checkpoint over ranks, what each
rank computes, and how the partial outputs are summed.

  TP (tensor parallel, `tp` ranks): each expert's intermediate dimension I is split. Rank r holds rows
      [r I_r, (r + 1) I_r) of the gate and of the up projection of w13 (interleaved checkpoints: the rows of
      those units, gate and up alternating) and the same columns of w2; b13 likewise; b2 on rank 0 only (it
      must be added once). Block scales travel with their blocks, so a rank's share of I must be a multiple
      of every block along I (w2's K blocks, the intermediate activation's blocks, FP8 128-row blocks of w13).
      Where I / tp is not, I is first padded with zero weights to the next multiple of tp x that block
      (gpt-oss: I = 2880 is 90 MX blocks; TP=4 pads it to 2944, 736 per rank). Zero w2 columns make padded
      units contribute exactly nothing. NVFP4 per-expert global scales and static input scales are per
      expert, the same on every shard.
  EP (expert parallel, `ep` ranks): rank r holds experts [r E_r, (r + 1) E_r). A pair routed to another
      rank's expert is sent with router weight 0 to a local expert that token does not use (vLLM writes zeros
      for expert id -1; a backend here takes only valid, distinct ids): its term is exactly 0 as long as that
      expert's output is finite (0 x Inf would be NaN; vLLM's skip has no such case). EP needs at least top_k
      experts per rank. Static input scales are the max over all
      experts, so every rank keeps the global maximum.
  Reduction: each rank returns a bf16 partial output; they are summed in `reduce` precision: BF16 as NCCL's
      all-reduce of bf16 tensors does (every add rounds to bf16, in an order NCCL picks: the bound allows the
      n - 2 intermediate roundings on top of the final one), FP32 as an engine that gathers the partials and
      sums them in fp32 (one rounding).

The reference of a sharded run is the unsharded reference with the per-rank rounding points the sharding
implies: the reference MoE run on each rank's canonical shard (shown to equal the unsharded one in exact
arithmetic: suites/test_parallel.py), then the declared reduction; the bound is the per-rank bounds carried
through the reduction. A backend under test runs on the shards a `Sharder` makes: the canonical one here,
or a seeded-bug variant (harness/parallel/mutants.py) whose mistakes the comparison must catch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from harness.backends import (backend_bound_declarations, backend_intermediate_multiple, backend_prepare, backend_structure, known_failure_for)
from harness.core.guard import guarded_call
from harness.core.tolerances import ErrorBound, U_BF16, _through_rounding, compare, gamma, moe_error_bound
from reference.checkpoints import MoECheckpoint, QuantizedWeight
from reference.moe import fused_moe, static_activation_scales
from reference.structure import NumericalStructure, Precision, RouterWeight, round_to

__all__ = ["Parallelism", "Sharder", "CANONICAL", "intermediate_block", "padded_intermediate", "sharded_reference",
           "run_sharded", "check_parallel_structure", "with_backend_padding", "PARALLEL_SHAPES", "PARALLEL_CASES", "parallel_shape",
           "run_parallel_case"]


@dataclass(frozen=True)
class Parallelism:
    tp: int = 1
    ep: int = 1
    reduce: Precision = Precision.BF16  # the all-reduce of the partial outputs
    # a rank's share of I is padded to a multiple of this too: the backend's declared padding rule
    # (harness.backends.backend_intermediate_multiple; torch's FP8 GEMMs want multiples of 16)
    intermediate_multiple: int = 1

    def __post_init__(self):
        for name in ("tp", "ep", "intermediate_multiple"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"Parallelism.{name} must be a positive int, got {v!r}")
        if self.tp > 1 and self.ep > 1:
            raise ValueError(f"Parallelism: TP and EP together (tp={self.tp}, ep={self.ep}) is not modelled; one at a time")
        if self.reduce not in (Precision.BF16, Precision.FP32):
            raise ValueError(f"Parallelism.reduce must be Precision.BF16 or FP32, got {self.reduce!r}")

    @property
    def ranks(self) -> int:
        return self.tp * self.ep

    @property
    def label(self) -> str:
        return f"tp{self.tp}" if self.tp > 1 else f"ep{self.ep}" if self.ep > 1 else "tp1"


def intermediate_block(ckpt: MoECheckpoint, backend_multiple: int = 1) -> int:
    """The block a rank's share of I must be a multiple of: w2's scale block along K (I), the intermediate
    activation's quantization block, w13's scale block along its rows (FP8 128x128), the backend's own."""
    s = ckpt.scheme
    blocks = [1, backend_multiple]
    if s.weight is not None:
        blocks += [s.weight.kind.k_block(s.weight), s.weight.kind.n_block(s.weight)]
    if s.act is not None:
        blocks.append(s.act.kind.k_block(s.act))
    return math.lcm(*blocks)


def padded_intermediate(ckpt: MoECheckpoint, tp: int, backend_multiple: int = 1) -> int:
    m = tp * intermediate_block(ckpt, backend_multiple)
    return -(-ckpt.intermediate_size // m) * m


# ---- weights along one logical dimension -------------------------------------------------------------


def _ratio(data_size: int, logical: int) -> tuple[int, int]:
    """(stored units per logical element as a fraction p/q): FP4 packs two elements per byte along K."""
    g = math.gcd(data_size, logical)
    return data_size // g, logical // g


def _slice_dim(t: torch.Tensor | None, dim: int, logical: int, start: int, stop: int) -> torch.Tensor | None:
    """Rows/columns [start, stop) of a logical dimension of size `logical`, for a tensor that stores it with
    its own granularity (codes, packed codes, or one scale per block)."""
    if t is None:
        return t
    p, q = _ratio(t.shape[dim], logical)
    if (start * p) % q or (stop * p) % q:
        raise ValueError(f"a shard boundary at {start}..{stop} cuts a block of {q // p} along a dim of {logical}")
    return t.narrow(dim, start * p // q, (stop - start) * p // q)


def _pad_dim(t: torch.Tensor | None, dim: int, logical: int, amount: int, fill=0) -> torch.Tensor | None:
    """`amount` more logical elements at the end of `dim`, filled with `fill` (zero codes or values; for a block
    scale dimension the scale that means 1, so that the padding's zero codes dequantize to exactly 0)."""
    if t is None or amount == 0:
        return t
    p, q = _ratio(t.shape[dim], logical)
    if (amount * p) % q:
        raise ValueError(f"padding {amount} along a dim of {logical} stored as {t.shape[dim]} cuts a block")
    shape = [amount * p // q if d == dim else n for d, n in enumerate(t.shape)]
    return torch.cat([t, torch.full(shape, fill, dtype=t.dtype, device=t.device)], dim=dim)


@dataclass(frozen=True)
class _Scales:
    """How a checkpoint's weight scales follow a split or padded dimension."""

    per_tensor: bool = False  # one scale per expert: shared by every shard and every padding
    unit: float | int = 1  # the stored scale meaning 1

    @classmethod
    def of(cls, ckpt: MoECheckpoint) -> _Scales:
        wq = ckpt.scheme.weight
        if wq is None:
            return cls()
        return cls(wq.kind.per_tensor_scale(wq), wq.kind.unit_scale(wq))


def _slice_weight(w: QuantizedWeight, rule: _Scales, dim: int, logical: int, start: int, stop: int) -> QuantizedWeight:
    """Logical rows (dim 1) or columns (dim 2) [start, stop) of a weight: its codes and block scales; global
    scales are per expert."""
    scale = w.scale if rule.per_tensor else _slice_dim(w.scale, dim, logical, start, stop)
    return QuantizedWeight(_slice_dim(w.data, dim, logical, start, stop), scale, w.global_scale)


def _pad_weight(w: QuantizedWeight, rule: _Scales, dim: int, logical: int, amount: int) -> QuantizedWeight:
    scale = w.scale if rule.per_tensor else _pad_dim(w.scale, dim, logical, amount, rule.unit)
    return QuantizedWeight(_pad_dim(w.data, dim, logical, amount), scale, w.global_scale)


def _cat_rows(parts: list[QuantizedWeight], rule: _Scales) -> QuantizedWeight:
    """Row blocks of one weight side by side (a per-tensor scale is shared, not repeated)."""
    s0 = parts[0].scale
    scale = s0 if s0 is None or rule.per_tensor else torch.cat([p.scale for p in parts], 1)
    return QuantizedWeight(torch.cat([p.data for p in parts], 1), scale, parts[0].global_scale)


def _w13_units(ckpt: MoECheckpoint, start: int, stop: int, isz: int) -> list[tuple[int, int]]:
    """w13 row ranges of intermediate units [start, stop) (a w13 of 2 * isz rows)."""
    if not ckpt.activation.gated:
        return [(start, stop)]
    if ckpt.activation.interleaved:
        return [(2 * start, 2 * stop)]
    return [(start, stop), (isz + start, isz + stop)]


def _w13_rows(w, rule: _Scales, ranges, n13: int):
    """The w13 rows (weight or bias) of the given ranges, concatenated."""
    if isinstance(w, QuantizedWeight):
        return _cat_rows([_slice_weight(w, rule, 1, n13, a, b) for a, b in ranges], rule)
    return None if w is None else torch.cat([w[:, a:b] for a, b in ranges], 1)


def pad_intermediate(ckpt: MoECheckpoint, new_isz: int) -> MoECheckpoint:
    """The same MoE with I grown to new_isz by zero weights (zero w2 columns: padded units contribute 0)."""
    isz = ckpt.intermediate_size
    extra = new_isz - isz
    if extra == 0:
        return ckpt
    n13 = ckpt.w13.data.shape[1]
    # gate and up halves each grow; an interleaved or ungated w13 grows at its end
    halves = ckpt.activation.gated and not ckpt.activation.interleaved
    ranges = [(0, isz), (isz, 2 * isz)] if halves else [(0, n13)]
    grow = extra if halves or not ckpt.activation.gated else 2 * extra
    rule = _Scales.of(ckpt)

    def pad13(w):
        if w is None:
            return None
        if isinstance(w, QuantizedWeight):
            return _cat_rows([_pad_weight(_slice_weight(w, rule, 1, n13, a, b), rule, 1, b - a, grow)
                              for a, b in ranges], rule)
        return torch.cat([_pad_dim(w[:, a:b], 1, b - a, grow) for a, b in ranges], 1)

    return dataclasses.replace(ckpt, intermediate_size=new_isz, w13=pad13(ckpt.w13), b13=pad13(ckpt.b13),
                               w2=_pad_weight(ckpt.w2, rule, 2, isz, extra))


def _experts(ckpt: MoECheckpoint, start: int, stop: int) -> MoECheckpoint:
    """Experts [start, stop); static input scales keep the max over all experts (a static scale is global)."""
    sl = lambda t: None if t is None else t[start:stop]  # noqa: E731
    weight = lambda w: QuantizedWeight(w.data[start:stop], sl(w.scale), sl(w.global_scale))  # noqa: E731
    scales = {}
    if static_activation_scales(ckpt)[0] is not None:
        aq = ckpt.scheme.act
        for name in ("w13_input_scale", "w2_input_scale"):
            stored = getattr(ckpt, name)
            best = int(torch.argmax(aq.kind.static_scale(stored, ckpt.nvfp4_global_convention).float()))
            scales[name] = stored[best].expand(stop - start).clone()
    return dataclasses.replace(ckpt, w13=weight(ckpt.w13), w2=weight(ckpt.w2), b13=sl(ckpt.b13), b2=sl(ckpt.b2),
                               **scales)


class Sharder:
    """The canonical way a checkpoint and a batch are split over ranks (what the reference assumes). Seeded
    bugs subclass it and change one step."""

    name = "canonical"

    def shard(self, ckpt: MoECheckpoint, par: Parallelism) -> list[MoECheckpoint]:
        if par.ep > 1:
            e = ckpt.num_experts
            if e % par.ep:
                raise ValueError(f"EP={par.ep} needs the expert count to be a multiple, got {e} experts")
            n = e // par.ep
            return [_experts(ckpt, r * n, (r + 1) * n) for r in range(par.ep)]
        padded = pad_intermediate(ckpt, padded_intermediate(ckpt, par.tp, par.intermediate_multiple))
        return [self.tp_shard(padded, r, par.tp) for r in range(par.tp)]

    def tp_shard(self, ckpt: MoECheckpoint, rank: int, tp: int) -> MoECheckpoint:
        isz = ckpt.intermediate_size
        per = isz // tp
        a, b = rank * per, (rank + 1) * per
        n13 = 2 * isz if ckpt.activation.gated else isz
        ranges = _w13_units(ckpt, a, b, isz)
        rule = _Scales.of(ckpt)
        b2 = ckpt.b2 if ckpt.b2 is None or rank == 0 else torch.zeros_like(ckpt.b2)  # added once
        return dataclasses.replace(
            ckpt, intermediate_size=per, w13=_w13_rows(ckpt.w13, rule, ranges, n13),
            b13=_w13_rows(ckpt.b13, rule, ranges, n13), b2=b2, w2=_slice_weight(ckpt.w2, rule, 2, isz, a, b))

    def route(self, topk_weights: torch.Tensor, topk_ids: torch.Tensor, par: Parallelism, rank: int,
              num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rank `rank`'s router weights and local expert ids."""
        if par.ep == 1:
            return topk_weights, topk_ids
        n = num_experts // par.ep
        t, k = topk_ids.shape
        if k > n:
            raise ValueError(f"EP={par.ep}: top_k={k} exceeds the {n} experts of a rank; a masked pair needs a local "
                             "expert id of its own (a token never names one expert twice)")
        local = (topk_ids >= rank * n) & (topk_ids < (rank + 1) * n)
        ids = torch.where(local, topk_ids - rank * n, 0)
        # masked pairs take the local experts this token does not use, smallest first (weight 0: term 0)
        dump = torch.where(local, ids, n)  # masked pairs mark a spare column
        used = torch.zeros(t, n + 1, dtype=torch.bool, device=ids.device).scatter_(1, dump, True)[:, :n]
        free = torch.argsort(used.to(torch.int8), dim=1, stable=True)  # unused ids first, in increasing order
        slot = torch.cumsum((~local).long(), dim=1) - 1
        ids = torch.where(local, ids, torch.gather(free, 1, slot.clamp_min(0)))
        return torch.where(local, topk_weights, torch.zeros_like(topk_weights)), ids

    def run(self, backend, what: str, ckpt: MoECheckpoint, inputs, par: Parallelism) -> torch.Tensor:
        """Every rank's forward on its shard, in turn, then the reduction: the bf16 output of the sharded MoE."""
        x, w, ids = inputs
        device = getattr(backend, "device", "cpu")
        partials = []
        for rank, shard in enumerate(self.shard(ckpt, par)):
            w_r, ids_r = self.route(w, ids, par, rank, ckpt.num_experts)
            prepared = guarded_call(backend, what, "prepare()", backend_prepare, backend, shard)
            out = guarded_call(backend, what, "forward()", backend.forward, prepared, x.to(device), w_r.to(device),
                               ids_r.to(device))
            partials.append(out.cpu())
        return self.reduce(partials, par)

    def reduce(self, partials: list[torch.Tensor], par: Parallelism) -> torch.Tensor:
        """Sum the ranks' bf16 partials in rank order: bf16 adds (NCCL-like) or fp32 then one rounding."""
        if par.reduce is Precision.FP32:
            return torch.stack([p.float() for p in partials]).sum(0).to(torch.bfloat16)
        acc = partials[0]
        for p in partials[1:]:
            acc = (acc.float() + p.float()).to(torch.bfloat16)
        return acc


CANONICAL = Sharder()


def with_backend_padding(par: Parallelism, backend) -> Parallelism:
    """par with the backend's declared multiple for a rank's share of I."""
    return dataclasses.replace(par, intermediate_multiple=backend_intermediate_multiple(backend))


def check_parallel_structure(structure: NumericalStructure, par: Parallelism) -> str | None:
    """Why this structure cannot be expert-parallel by masking (None: it can)."""
    if par.ep > 1 and structure.router_weight is RouterWeight.GEMM1_EPILOGUE:
        return ("EP masks other ranks' pairs with router weight 0; with the weight applied on GEMM1's input a "
                "zero-weight pair still yields W2 act(b13) + b2, not 0")
    return None


def sharded_reference(x, ckpt: MoECheckpoint, w, ids, par: Parallelism, structure: NumericalStructure,
                      declarations: dict):
    """(the reference bf16 output of the sharded run, its ErrorBound, the per-rank float64 exact partials):
    the reference MoE on each canonical shard, the reduction in fp32 with one rounding, and the bound: the
    per-rank bounds summed, fp32 adds, and for a bf16 all-reduce the roundings after all but the last add."""
    shards = CANONICAL.shard(ckpt, par)
    outs, bounds, exacts = [], [], []
    for rank, shard in enumerate(shards):
        w_r, ids_r = CANONICAL.route(w, ids, par, rank, ckpt.num_experts)
        out, trace = fused_moe(x, shard, w_r, ids_r, structure=structure, trace=True)
        outs.append(out.double())
        bounds.append(moe_error_bound(trace, shard, **declarations).bound)
        exacts.append(fused_moe(x, shard, w_r, ids_r, structure=structure, exact=True))
    total = torch.stack(outs).sum(0)
    n = len(outs)
    magnitude = torch.stack([o.abs() + b for o, b in zip(outs, bounds)]).sum(0)
    d = torch.stack(bounds).sum(0) + (gamma(n) * magnitude if n > 1 else 0.0)
    if par.reduce is Precision.BF16 and n > 2:
        d = d + gamma(n - 2, U_BF16) * magnitude  # the n - 2 intermediate bf16 roundings, any order, compounded
    expected = round_to(total, Precision.BF16).to(torch.bfloat16)
    return expected, ErrorBound(_through_rounding(d, total, Precision.BF16)), exacts


def run_sharded(backend, ckpt: MoECheckpoint, inputs, par: Parallelism, what: str, sharder: Sharder = CANONICAL):
    """Run `backend` on each rank's shard in turn (simulated parallelism), reduce, compare with the sharded
    reference. Returns the Comparison."""
    structure = backend_structure(backend)
    why = check_parallel_structure(structure, par)
    if why:
        raise ValueError(f"{what}: {why}")
    par = with_backend_padding(par, backend)
    x, w, ids = inputs
    expected, bound, exacts = sharded_reference(x, ckpt, w, ids, par, structure,
                                                backend_bound_declarations(backend, ckpt.scheme.name))
    got = sharder.run(backend, what, ckpt, inputs, par)
    exact = torch.stack(exacts).sum(0)
    return compare(expected, got, bound, f"{what}: output", structure=structure, exact=exact)


# ---- cases -------------------------------------------------------------------------------------------

# one case per scheme family; activations vary so that interleaved (SWIGLUOAI), gated and ungated w13 shard
PARALLEL_CASES = (("bf16", "SILU"), ("w_mxfp4", "SWIGLUOAI"), ("w_mxfp4_a_mxfp4", "GELU"), ("w_nvfp4_a_nvfp4", "SILU"),
                  ("w_fp8_a_fp8", "RELU2_NO_MUL"), ("w_fp8_a_fp8_block", "SILU"))

# Sharded cases on the CPU: I = 5 blocks, so that I / tp is not a whole number of blocks for tp = 2 and 4
# (padding is exercised), 8 experts so that EP=2 leaves each rank top_k of them; realistic ones on GPUs.
PARALLEL_SHAPES = {"cpu": (8, 128, 5, 8, 3), "gpu": (8, 512, 9, 64, 4)}  # E, H, I in blocks, T, top_k


def parallel_shape(scheme, host_is_gpu: bool):
    """The Shape of a sharded case for this scheme: I = n blocks of the scheme's own multiple for I (at least
    32, so that unquantized schemes are split into unequal-looking shares too)."""
    from harness.core.conformance import Shape

    e, h, blocks, t, k = PARALLEL_SHAPES["gpu" if host_is_gpu else "cpu"]
    multiple = max(32, scheme.k_multiple(), scheme.n_multiple())
    return Shape(num_experts=e, hidden_size=h, intermediate_size=blocks * multiple, tokens=t, top_k=k)


def run_parallel_case(backend, scheme, activation, platform, par: Parallelism, shape, seed: int = 0,
                      sharder: Sharder = CANONICAL):
    """One sharded conformance case: the Comparison, or why it does not run (a str)."""
    from harness.backends import Declined, backend_available
    from harness.core.conformance import case_checkpoint, case_inputs, case_problem

    structure = backend_structure(backend)
    why = check_parallel_structure(structure, par)
    if why:
        return f"{backend.name}: {why}"
    ckpt_full = case_checkpoint(scheme.name, activation.name, platform.fp8_format.name, shape, seed, True)
    local = CANONICAL.shard(ckpt_full, with_backend_padding(par, backend))[0]
    rank_shape = dataclasses.replace(shape, num_experts=local.num_experts, intermediate_size=local.intermediate_size)
    problem, ok, reason = case_problem(backend, scheme, activation, platform, rank_shape)
    if not ok:
        return f"{backend.name} does not support a rank's share ({rank_shape}): {reason}"
    ok, reason = backend_available(backend, platform)
    if not ok:
        return f"{backend.name} cannot run here: {reason}"
    known = known_failure_for(backend, scheme.name, problem.has_bias)
    if known:  # the unsharded suite runs it as a strict expected failure; sharded, it would only fail again
        return f"{backend.name}: a declared known failure ({known.reason}); the unsharded suites check it"
    ckpt = ckpt_full if problem.has_bias else case_checkpoint(scheme.name, activation.name, platform.fp8_format.name,
                                                              shape, seed, False)
    what = f"{scheme.name}/{activation.name}/{backend.name}/{platform.name}/{par.label}"
    try:
        return run_sharded(backend, ckpt, case_inputs(shape, seed), par, what, sharder)
    except Declined as declined:
        return str(declined)
