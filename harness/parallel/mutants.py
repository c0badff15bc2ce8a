"""Seeded bugs of the sharding layer: each a Sharder that gets one step wrong the way real engines have, run
against the canonical sharded reference (suites/test_parallel.py asserts each is caught)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from reference.checkpoints import MoECheckpoint, QuantizedWeight, dequantize_weight

from .sharding import Parallelism, Sharder, intermediate_block, pad_intermediate, padded_intermediate

__all__ = ["ParallelMutant", "PARALLEL_MUTANTS"]


def _requantize(ckpt: MoECheckpoint, name: str, values: torch.Tensor) -> QuantizedWeight:
    """fp32 values [E, N, K] quantized as the checkpoint's scheme stores weights (global scales from these
    values' own amax)."""
    wq = ckpt.scheme.weight
    if wq is None:
        return QuantizedWeight(values.to(torch.bfloat16))
    return QuantizedWeight(*wq.kind.quantize_weight(wq, values, ckpt.nvfp4_global_convention, ckpt.fp8_format))


class _PaddingLeaks(Sharder):
    """I padded with whatever the buffer held (here: copies of the first units) instead of zeros."""

    name = "padding_leaks"

    def shard(self, ckpt, par):
        if par.tp == 1:
            return super().shard(ckpt, par)
        isz, new = ckpt.intermediate_size, padded_intermediate(ckpt, par.tp, par.intermediate_multiple)
        w13 = dequantize_weight(ckpt.w13, ckpt.scheme.weight, ckpt)
        w2 = dequantize_weight(ckpt.w2, ckpt.scheme.weight, ckpt)
        extra = new - isz
        gated, inter = ckpt.activation.gated, ckpt.activation.interleaved
        if gated and not inter:
            w13 = torch.cat([w13[:, :isz], w13[:, :extra], w13[:, isz:], w13[:, isz:isz + extra]], 1)
        else:
            n = extra * (2 if gated else 1)
            w13 = torch.cat([w13, w13[:, :n]], 1)
        w2 = torch.cat([w2, w2[:, :, :extra]], 2)
        leaky = dataclasses.replace(pad_intermediate(ckpt, new), w13=_requantize(ckpt, "w13", w13),
                                    w2=_requantize(ckpt, "w2", w2))
        return [self.tp_shard(leaky, r, par.tp) for r in range(par.tp)]


class _BlockSplitRequantized(Sharder):
    """No padding: I split at I / tp, through the middle of a block; each rank re-quantizes its columns of
    w2 (zero-padded to a whole block) and quantizes its share of the intermediate activation on its own."""

    name = "block_split_requantized"

    def shard(self, ckpt, par):
        if par.tp == 1:
            return super().shard(ckpt, par)
        isz = ckpt.intermediate_size
        per = -(-isz // par.tp)
        block = intermediate_block(ckpt, par.intermediate_multiple)
        local = -(-per // block) * block
        w13 = dequantize_weight(ckpt.w13, ckpt.scheme.weight, ckpt)
        w2 = dequantize_weight(ckpt.w2, ckpt.scheme.weight, ckpt)
        gated, inter = ckpt.activation.gated, ckpt.activation.interleaved
        shards = []
        for r in range(par.tp):
            a, b = r * per, min((r + 1) * per, isz)
            pad = local - (b - a)
            zeros13 = torch.zeros(w13.shape[0], pad * (2 if gated and inter else 1), w13.shape[2])
            if gated and not inter:
                rows = torch.cat([w13[:, a:b], zeros13, w13[:, isz + a:isz + b], zeros13], 1)
            elif gated:
                rows = torch.cat([w13[:, 2 * a:2 * b], zeros13], 1)
            else:
                rows = torch.cat([w13[:, a:b], zeros13], 1)
            cols = torch.cat([w2[:, :, a:b], torch.zeros(w2.shape[0], w2.shape[1], pad)], 2)
            b13 = None
            if ckpt.b13 is not None:
                z = torch.zeros(ckpt.b13.shape[0], pad * (2 if gated and inter else 1))
                b13 = (torch.cat([ckpt.b13[:, a:b], z, ckpt.b13[:, isz + a:isz + b], z], 1) if gated and not inter
                       else torch.cat([ckpt.b13[:, 2 * a:2 * b] if gated else ckpt.b13[:, a:b], z], 1))
            b2 = ckpt.b2 if ckpt.b2 is None or r == 0 else torch.zeros_like(ckpt.b2)
            shards.append(dataclasses.replace(ckpt, intermediate_size=local, w13=_requantize(ckpt, "w13", rows),
                                              w2=_requantize(ckpt, "w2", cols), b13=b13, b2=b2))
        return shards


class _GlobalScalePerShard(Sharder):
    """Each TP shard re-quantized with a global (NVFP4 per-expert) scale from its own amax instead of the
    expert's."""

    name = "global_scale_per_shard"

    def tp_shard(self, ckpt, rank, tp):
        shard = super().tp_shard(ckpt, rank, tp)
        return dataclasses.replace(
            shard, **{n: _requantize(shard, n, dequantize_weight(getattr(shard, n), shard.scheme.weight, shard))
                      for n in ("w13", "w2")})


class _EPDoubleCounts(Sharder):
    """Other ranks' pairs are not masked (their router weight kept): every pair is counted on every rank, on
    the rank's own expert where it is local and on some other local expert elsewhere."""

    name = "ep_double_counts"

    def route(self, topk_weights, topk_ids, par, rank, num_experts):
        _, ids = super().route(topk_weights, topk_ids, par, rank, num_experts)
        return topk_weights, ids


class _ExpertMapOffByOne(Sharder):
    """The expert map off by one: rank r's local expert i holds global expert r E_r + i + 1."""

    name = "expert_map_off_by_one"

    def shard(self, ckpt, par):
        if par.ep == 1:
            return super().shard(ckpt, par)
        order = torch.roll(torch.arange(ckpt.num_experts), -1)  # expert e + 1 where e should be
        pick = lambda t: None if t is None else t[order]  # noqa: E731
        moved = dataclasses.replace(
            ckpt, w13=QuantizedWeight(ckpt.w13.data[order], pick(ckpt.w13.scale), pick(ckpt.w13.global_scale)),
            w2=QuantizedWeight(ckpt.w2.data[order], pick(ckpt.w2.scale), pick(ckpt.w2.global_scale)),
            b13=pick(ckpt.b13), b2=pick(ckpt.b2))
        return super().shard(moved, par)


class _ReducedBeforeRouterWeight(Sharder):
    """TP partials of each (token, k) pair all-reduced before the router weight multiplies them (the
    weighting and the top-k sum after the all-reduce), where the structure applies it inside each rank.
    In exact arithmetic this is the same sum: it is caught only by where it rounds (one bf16 rounding per
    pair more, the declared epilogue weighting and sequential sum replaced), several ulps on a tenth of the
    elements, so its detection depends on the bound being tight."""

    name = "reduced_before_router_weight"

    def run(self, backend, what, ckpt, inputs, par):
        if par.tp == 1:
            return super().run(backend, what, ckpt, inputs, par)
        x, w, ids = inputs
        out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32)
        for j in range(ids.shape[1]):
            one = torch.ones_like(w[:, j:j + 1])
            per_slot = super().run(backend, what, ckpt, (x, one, ids[:, j:j + 1]), par)
            out += w[:, j:j + 1].float() * per_slot.float()
        return out.to(torch.bfloat16)


@dataclass(frozen=True)
class ParallelMutant:
    sharder: Sharder
    description: str
    scheme: str  # a scheme where the bug changes values
    activation: str
    parallelism: Parallelism


PARALLEL_MUTANTS: tuple[ParallelMutant, ...] = (
    ParallelMutant(_PaddingLeaks(), "shard padding filled with copies of real units, not zeros", "w_mxfp4",
                   "SWIGLUOAI", Parallelism(tp=2)),
    ParallelMutant(_BlockSplitRequantized(), "an MX block split across two ranks, each re-quantizing its part",
                   "w_mxfp4_a_mxfp4", "SILU", Parallelism(tp=2)),
    ParallelMutant(_GlobalScalePerShard(), "the NVFP4 per-expert global scale recomputed per shard", "w_nvfp4",
                   "SILU", Parallelism(tp=2)),
    ParallelMutant(_EPDoubleCounts(), "EP ranks count other ranks' pairs too", "bf16", "SILU", Parallelism(ep=2)),
    ParallelMutant(_ExpertMapOffByOne(), "the EP expert map off by one", "bf16", "SILU", Parallelism(ep=2)),
    ParallelMutant(_ReducedBeforeRouterWeight(), "partials reduced before the router weighting", "bf16", "SILU",
                   Parallelism(tp=2)),
)
