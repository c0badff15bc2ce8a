"""dequantize_all: the dequantize-everything baseline, how vLLM's OCP MX emulation works today: in every
forward, all experts' weights are dequantized to bf16 with torch ops, then a bf16 fused MoE runs
(triton_emulation's kernels, weights unquantized; activations still quantized as the scheme says). The
dequantization is the reference's own (reference.checkpoints.dequantize_weight on device tensors). It is
the speed baseline of `make bench` ("x faster than dequantize-all"); it runs where it is timed, on a GPU."""

from __future__ import annotations

import dataclasses

import torch

from harness.platforms import has_gpu
from reference.checkpoints import MoECheckpoint, QuantizedWeight, dequantize_weight

from .triton_emulation import TritonEmulationBackend


@dataclasses.dataclass
class _Prepared:
    ckpt: MoECheckpoint  # the quantized checkpoint (forward's input checks read it)
    inner: object  # triton_emulation's prepared weightless checkpoint
    weights: dict  # w13 / w2 codes and scales on the device


class DequantizeAllBaseline(TritonEmulationBackend):
    """torch_emulation's method (and vLLM's OCP MX emulation's) on the device: in every forward, all
    experts' weights are dequantized to bf16 by the reference dequantizers (torch ops, run on the device),
    then triton_emulation's fused MoE runs on them (activations still quantized as the scheme says)."""

    name = "dequantize_all"
    operand_dtype = torch.bfloat16
    numerical_structure = "rounded_terms"  # triton_emulation's kernels do the rest
    # the reference dequantizers validate their inputs (host syncs), so the benchmark times this eagerly, as
    # vLLM's emulation runs (a failed CUDA-graph capture also strands its memory pool: the H200 run of
    # 2026-12-01 ran out of memory after one)
    graph_capturable = False

    def supports(self, problem, platform):
        if problem.scheme.weight is None:
            return False, "quantized weights only (bf16 has nothing to dequantize)"
        return super().supports(problem, platform)

    def available(self, platform) -> tuple[bool, str]:
        if not has_gpu():
            return False, "a speed baseline: runs where it is timed, on a GPU (triton_emulation covers the CPU)"
        return super().available(platform)

    def prepare(self, ckpt: MoECheckpoint):
        dev = self.device
        weightless = dataclasses.replace(ckpt, scheme=dataclasses.replace(ckpt.scheme, weight=None))
        on_dev = lambda t: None if t is None else t.to(dev)  # noqa: E731
        weights = {n: QuantizedWeight(on_dev(getattr(ckpt, n).data), on_dev(getattr(ckpt, n).scale),
                                      on_dev(getattr(ckpt, n).global_scale)) for n in ("w13", "w2")}
        # the weightless checkpoint's weights are replaced by their bf16 dequantization in every launch()
        return _Prepared(ckpt, super().prepare(weightless), weights)

    EXPERTS_PER_CHUNK = 16  # bounds the fp32 temporaries (Kimi-K2: 384 experts, 11G weights)

    @classmethod
    def _dequantize(cls, w: QuantizedWeight, ckpt: MoECheckpoint) -> torch.Tensor:
        out = None
        for e0 in range(0, w.data.shape[0], cls.EXPERTS_PER_CHUNK):
            sl = slice(e0, e0 + cls.EXPERTS_PER_CHUNK)
            part = QuantizedWeight(w.data[sl], w.scale[sl], None if w.global_scale is None else w.global_scale[sl])
            values = dequantize_weight(part, ckpt.scheme.weight, ckpt)
            if out is None:  # written chunk by chunk: no second copy of all experts' bf16 weights
                out = torch.empty(w.data.shape[0], *values.shape[1:], dtype=torch.bfloat16, device=values.device)
            out[sl] = values
        return out

    def launch(self, prep: _Prepared, x, topk_weights, topk_ids):
        inner = dataclasses.replace(prep.inner, w13=self._dequantize(prep.weights["w13"], prep.ckpt),
                                    w2=self._dequantize(prep.weights["w2"], prep.ckpt))
        return super().launch(inner, x, topk_weights, topk_ids)


def make_backend() -> DequantizeAllBaseline:
    return DequantizeAllBaseline()
