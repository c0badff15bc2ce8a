"""dequantize_all: the dequantize-everything baseline, how vLLM's OCP MX emulation works today: in every
forward, all experts' weights are dequantized to bf16 with torch ops, then a bf16 fused MoE runs
(triton_emulation's kernels, weights unquantized; activations still quantized as the scheme says). It is
the speed baseline of `make bench` ("x faster than dequantize-all"); it runs where it is timed, on a GPU."""

from __future__ import annotations

import dataclasses

import torch

from harness.platforms import has_gpu
from reference.checkpoints import MoECheckpoint, QuantizedWeight
from reference.formats import E2M1, E4M3FN
from reference.quantizers import MX, NVFP4, nvfp4_decode_scale

from .triton_emulation import TritonEmulationBackend


@dataclasses.dataclass
class _Prepared:
    ckpt: MoECheckpoint  # the quantized checkpoint (forward's input checks read it)
    inner: object  # triton_emulation's prepared weightless checkpoint
    luts: dict
    weights: dict  # w13 / w2 codes and scales on the device


class DequantizeAllBaseline(TritonEmulationBackend):
    """torch_emulation's method (and vLLM's OCP MX emulation's) on the device: in every forward, all
    experts' weights are dequantized to bf16 with torch ops, then triton_emulation's fused MoE runs on
    them (activations still quantized as the scheme says)."""

    name = "dequantize_all"
    operand_dtype = torch.bfloat16
    numerical_structure = "rounded_terms"  # triton_emulation's kernels do the rest

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
        wq = ckpt.scheme.weight
        elem = wq.kind.code_format(wq, ckpt.fp8_format)
        luts = dict(code=elem.values_fp32.to(dev), e4m3=E4M3FN.values_fp32.to(dev), e2m1=E2M1.values_fp32.to(dev))
        on_dev = lambda t: None if t is None else t.to(dev)  # noqa: E731
        weights = {n: QuantizedWeight(on_dev(getattr(ckpt, n).data), on_dev(getattr(ckpt, n).scale),
                                      on_dev(getattr(ckpt, n).global_scale)) for n in ("w13", "w2")}
        # the weightless checkpoint's weights are replaced by their bf16 dequantization in every launch()
        return _Prepared(ckpt, super().prepare(weightless), luts, weights)

    EXPERTS_PER_CHUNK = 16  # bounds the fp32 temporaries (Kimi-K2: 384 experts, 11G weights)

    @classmethod
    def _dequantize(cls, w: QuantizedWeight, ckpt: MoECheckpoint, luts) -> torch.Tensor:
        wq = ckpt.scheme.weight
        e = w.data.shape[0]
        k = w.data.shape[2] * (2 if wq.kind.code_format(wq, ckpt.fp8_format).nbits == 4 else 1)
        out = torch.empty(e, w.data.shape[1], k, dtype=torch.bfloat16, device=w.data.device)
        for e0 in range(0, e, cls.EXPERTS_PER_CHUNK):
            sl = slice(e0, e0 + cls.EXPERTS_PER_CHUNK)
            out[sl] = cls._dequantize_experts(w, sl, ckpt, luts)
        return out

    @staticmethod
    def _dequantize_experts(w: QuantizedWeight, sl: slice, ckpt: MoECheckpoint, luts) -> torch.Tensor:
        wq = ckpt.scheme.weight
        codes = w.data[sl]
        if wq.kind.code_format(wq, ckpt.fp8_format).nbits == 4:
            codes = torch.stack((codes & 0xF, codes >> 4), dim=-1).flatten(-2)
        v = luts["code"][codes.int()]
        e, n, k = v.shape
        if wq.kind is MX:
            s = torch.exp2(w.scale[sl].float() - 127)
            v = (v.view(e, n, k // 32, 32) * s[..., None]).view(e, n, k)
        elif wq.kind is NVFP4:
            s_dec = nvfp4_decode_scale(w.global_scale[sl], ckpt.nvfp4_global_convention)
            # the reference's order: code value x block scale, then x the global decode scale
            v = (v.view(e, n, k // 16, 16) * luts["e4m3"][w.scale[sl].int()][..., None]
                 * s_dec[:, None, None, None]).view(e, n, k)
        elif w.scale[sl].numel() == e:  # per-tensor FP8: one scale per expert, any shape
            v = v * w.scale[sl].reshape(e, 1, 1)
        else:  # FP8 128x128 blocks
            v = v * w.scale[sl].repeat_interleave(128, 1).repeat_interleave(128, 2)
        return v.to(torch.bfloat16)

    def launch(self, prep: _Prepared, x, topk_weights, topk_ids):
        inner = dataclasses.replace(prep.inner, w13=self._dequantize(prep.weights["w13"], prep.ckpt, prep.luts),
                                    w2=self._dequantize(prep.weights["w2"], prep.ckpt, prep.luts))
        return super().launch(inner, x, topk_weights, topk_ids)


def make_backend() -> DequantizeAllBaseline:
    return DequantizeAllBaseline()
