"""torch_fp8: w_fp8_a_fp8 on FP8 tensor cores through torch._scaled_mm, one call per expert.

Activations are quantized on the device with torch (x / scale, clamped to +-max, cast: in range the
cast rounds to nearest even, as the reference; the conformance suite checks the result). The platform's
FP8 dtype is used: e4m3fn on sm90/sm100/gfx950, e4m3fnuz on gfx942 (MI300), so a checkpoint of the
other dtype is refused. _scaled_mm applies both scales to its fp32 accumulator and rounds to bf16 once
(the scheme's rounding point); biases are not supported (bf16-only in _scaled_mm); the top-k sum is an
ordered fp32 sum."""

from __future__ import annotations

import torch

from harness.platforms import PLATFORMS, default_device, detect_platform, has_gpu
from reference.activations import apply_activation
from reference.checkpoints import MoECheckpoint
from reference.fp8 import Granularity
from reference.moe import check_moe_inputs, static_activation_scales
from reference.structure import STRUCTURES

_TORCH_FP8 = {"e4m3fn": torch.float8_e4m3fn, "e4m3fnuz": torch.float8_e4m3fnuz}


class TorchFP8Backend:
    name = "torch_fp8"
    operand_dtype = torch.float32  # FP8 codes are the operands; scales multiply fp32 results
    # Hopper's FP8 tensor cores do not accumulate in full fp32 between cuBLASLt's promotions (the platform's
    # measured fact, harness.platforms)
    accumulation_error = PLATFORMS["sm90"].fp8_mma_accumulation_error
    # _scaled_mm rounds each GEMM's scaled fp32 accumulator to bf16; the activation is fp32, rounded once;
    # the weighted top-k sum is fp32 over the rounded rows; activations are quantized as x / scale
    numerical_structure = STRUCTURES["rounded_terms"]
    intermediate_multiple = 16  # _scaled_mm wants every dim a multiple of 16 (a TP share of I is padded to it)

    def __init__(self):
        self.device = default_device()

    def supports(self, problem, platform) -> tuple[bool, str]:
        if "fp8" not in platform.native_formats:
            return False, f"{platform.name} has no FP8 matrix units"
        w = problem.scheme.weight
        if problem.scheme.name != "w_fp8_a_fp8" or w.granularity is not Granularity.PER_TENSOR:
            return False, "torch._scaled_mm path covers w_fp8_a_fp8 with per-tensor scales only"
        if problem.has_bias:
            return False, ("torch._scaled_mm returns bf16 with the bias added in bf16; an fp32 checkpoint bias "
                           "would be rounded before the rounding point")
        if problem.hidden_size % 16 or problem.intermediate_size % 16:
            return False, (f"torch._scaled_mm wants H and I multiples of 16, got H={problem.hidden_size}, "
                           f"I={problem.intermediate_size}")
        return True, f"torch._scaled_mm with {platform.fp8_format.name}"

    def available(self, platform) -> tuple[bool, str]:
        if not has_gpu():
            return False, "needs a GPU with FP8 matrix units (torch._scaled_mm); none here"

        here = detect_platform()
        if here.fp8_format is not platform.fp8_format:
            return False, f"this {here.name} GPU runs {here.fp8_format.name}, not {platform.name}'s {platform.fp8_format.name}"
        return True, ""

    def prepare(self, ckpt: MoECheckpoint):
        dt = _TORCH_FP8[ckpt.fp8_format.name]
        a1_scale, a2_scale = static_activation_scales(ckpt)
        dev = self.device
        return dict(
            ckpt=ckpt,
            w13=ckpt.w13.data.to(dev).view(dt), w2=ckpt.w2.data.to(dev).view(dt),
            # one separately allocated 0-d scale per expert: cuBLASLt refuses a scale pointer at an odd
            # 4-byte offset into a [E] tensor (CUBLAS_STATUS_NOT_SUPPORTED on the H200)
            s13=[v.clone() for v in ckpt.w13.scale.reshape(-1).float().to(dev)],
            s2=[v.clone() for v in ckpt.w2.scale.reshape(-1).float().to(dev)],
            b13=None if ckpt.b13 is None else ckpt.b13.float().to(dev),
            b2=None if ckpt.b2 is None else ckpt.b2.float().to(dev),
            a1_scale=a1_scale.float().to(dev).reshape(()), a2_scale=a2_scale.float().to(dev).reshape(()), dtype=dt,
        )

    @staticmethod
    def _quantize(x: torch.Tensor, scale: torch.Tensor, dt, fmax: float) -> torch.Tensor:
        return (x.float() / scale).clamp(-fmax, fmax).to(dt)

    @staticmethod
    def _mm(a_fp8, w_fp8, s_a, s_w):
        m = a_fp8.shape[0]
        pad = (-m) % 16  # _scaled_mm wants every dim a multiple of 16
        if pad:
            a_fp8 = torch.cat([a_fp8, torch.zeros(pad, a_fp8.shape[1], dtype=a_fp8.dtype, device=a_fp8.device)])
        # bf16 out: the scales multiply the fp32 accumulator and cuBLAS rounds once, which is the
        # scheme's gemm*_out rounding point
        out = torch._scaled_mm(a_fp8, w_fp8.t(), scale_a=s_a, scale_b=s_w, out_dtype=torch.bfloat16)
        return out[:m].float()

    def forward(self, prep, hidden_states, topk_weights, topk_ids):
        ckpt = prep["ckpt"]
        check_moe_inputs(hidden_states.cpu(), ckpt, topk_weights.cpu(), topk_ids.cpu())
        fmax = ckpt.fp8_format.max_normal
        t, h = hidden_states.shape
        k = topk_ids.shape[1]
        a1 = self._quantize(hidden_states, prep["a1_scale"], prep["dtype"], fmax)
        z = torch.zeros(t * k, h, dtype=torch.float32, device=hidden_states.device)
        flat = topk_ids.reshape(-1)
        tokens = torch.arange(t, device=flat.device).repeat_interleave(k)
        for e in flat.unique().tolist():
            rows = (flat == e).nonzero().flatten()
            if prep["b13"] is not None or prep["b2"] is not None:
                raise NotImplementedError("torch_fp8: no biases (see supports)")
            he = self._mm(a1[tokens[rows]], prep["w13"][e], prep["a1_scale"], prep["s13"][e])
            y = apply_activation(he, ckpt.activation).to(torch.bfloat16).float()
            a2 = self._quantize(y, prep["a2_scale"], prep["dtype"], fmax)
            z[rows] = self._mm(a2, prep["w2"][e], prep["a2_scale"], prep["s2"][e])
        out = torch.zeros(t, h, dtype=torch.float32, device=z.device)
        zk = z.view(t, k, h)
        for j in range(k):  # ordered: deterministic
            out += topk_weights[:, j : j + 1].float() * zk[:, j]
        return out.to(torch.bfloat16)


def make_backend() -> TorchFP8Backend:
    return TorchFP8Backend()
