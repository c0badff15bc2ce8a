"""torch_blockscaled: MXFP4 and NVFP4 W4A4 MoE through torch._scaled_mm's block-scaled GEMM (sm100).

UNTESTED ON HARDWARE: this project has no Blackwell GPU. What is tested (suites/test_layouts.py) is the
128x4 scale swizzle this backend feeds the GEMM, and its round trip; supports() and available() keep
the backend out of every run that is not on an sm100 machine. Activations are quantized with the
reference quantizers (bit-exact by definition), packed FP4 codes are passed as float4_e2m1fn_x2, block
scales as float8_e8m0fnu (MX) or float8_e4m3fn (NVFP4) in the swizzled layout, NVFP4 global scales
multiply the fp32 output."""

from __future__ import annotations

import torch

from harness.platforms import PLATFORMS, default_device, detect_platform
from harness.backends.layouts import swizzle_scales_128x4
from reference.activations import apply_activation
from reference.checkpoints import MoECheckpoint, nvfp4_decode_scale
from reference.moe import check_moe_inputs, static_activation_scales
from reference.mx import quantize_mx
from reference.nvfp4 import quantize_nvfp4
from reference.packing import pack_fp4
from reference.quantizers import MX, NVFP4
from reference.structure import STRUCTURES

_SCHEMES = {"w_mxfp4_a_mxfp4": MX, "w_nvfp4_a_nvfp4": NVFP4}


class TorchBlockScaledBackend:
    name = "torch_blockscaled"
    operand_dtype = torch.float32
    numerical_structure = STRUCTURES["rounded_terms"]  # bf16 after each GEMM and the activation; fp32 weighted sum

    def __init__(self):
        self.device = default_device()

    def supports(self, problem, platform) -> tuple[bool, str]:
        if not {"mxfp4", "nvfp4"} <= platform.native_formats or platform.vendor != "nvidia":
            return False, f"{platform.name} has no block-scaled FP4 tensor cores (sm100)"
        if problem.scheme.name not in _SCHEMES:
            return False, "block-scaled _scaled_mm path: w_mxfp4_a_mxfp4 and w_nvfp4_a_nvfp4 only"
        return True, "torch._scaled_mm block-scaled FP4 (untested on hardware)"

    def available(self, platform) -> tuple[bool, str]:
        if detect_platform() is not PLATFORMS["sm100"]:
            return False, "needs an sm100 GPU (Blackwell block-scaled FP4); untested on hardware"
        return True, ""

    def prepare(self, ckpt: MoECheckpoint):
        dev = self.device
        kind = _SCHEMES[ckpt.scheme.name]
        sdt = torch.float8_e8m0fnu if kind is MX else torch.float8_e4m3fn

        def weight(w):
            e, n, kp = w.data.shape
            swz = torch.stack([swizzle_scales_128x4(w.scale[i]) for i in range(e)]).view(sdt)
            g = None
            if kind is NVFP4:
                g = nvfp4_decode_scale(w.global_scale, ckpt.nvfp4_global_convention).float().to(dev)
            return w.data.to(dev).view(torch.float4_e2m1fn_x2), swz.to(dev), g

        a1_scale, a2_scale = static_activation_scales(ckpt)
        return dict(ckpt=ckpt, kind=kind, sdt=sdt, w13=weight(ckpt.w13), w2=weight(ckpt.w2), a1_scale=a1_scale,
                    a2_scale=a2_scale)

    def _quantize(self, x, prep, static_scale):
        xc = x.float().cpu()
        if prep["kind"] is MX:
            q = quantize_mx(xc, prep["ckpt"].scheme.act.elem)
            codes, scales, g = q.codes, q.scales, None
        else:
            q = quantize_nvfp4(xc, global_decode_scale=static_scale)
            codes, scales, g = q.codes, q.block_scales, static_scale
        m = codes.shape[0]
        pad = (-m) % 128
        codes = torch.cat([codes, torch.zeros(pad, codes.shape[1], dtype=torch.uint8)])
        packed = pack_fp4(codes).to(self.device).view(torch.float4_e2m1fn_x2)
        return packed, swizzle_scales_128x4(scales).view(prep["sdt"]).to(self.device), g, m

    def _mm(self, a, w, e, prep):
        packed, sa, ga, m = a
        wp, ws, wg = w
        out = torch._scaled_mm(packed, wp[e].t(), scale_a=sa, scale_b=ws[e], out_dtype=torch.float32)[:m]
        if prep["kind"] is NVFP4:
            out = out * (ga.to(out.device) * wg[e])
        return out

    def forward(self, prep, hidden_states, topk_weights, topk_ids):
        ckpt = prep["ckpt"]
        check_moe_inputs(hidden_states.cpu(), ckpt, topk_weights.cpu(), topk_ids.cpu())
        t, h = hidden_states.shape
        k = topk_ids.shape[1]
        flat = topk_ids.reshape(-1)
        tokens = torch.arange(t, device=flat.device).repeat_interleave(k)
        z = torch.zeros(t * k, h, dtype=torch.float32, device=self.device)
        for e in flat.unique().tolist():
            rows = (flat == e).nonzero().flatten()
            a1 = self._quantize(hidden_states[tokens[rows]], prep, prep["a1_scale"])
            he = self._mm(a1, prep["w13"], e, prep)
            if ckpt.b13 is not None:
                he = he + ckpt.b13[e].to(he.device)
            y = apply_activation(he.to(torch.bfloat16).float(), ckpt.activation).to(torch.bfloat16)
            ze = self._mm(self._quantize(y, prep, prep["a2_scale"]), prep["w2"], e, prep)
            if ckpt.b2 is not None:
                ze = ze + ckpt.b2[e].to(ze.device)
            z[rows] = ze.to(torch.bfloat16).float()
        out = torch.zeros(t, h, dtype=torch.float32, device=z.device)
        zk = z.view(t, k, h)
        for j in range(k):
            out += topk_weights[:, j : j + 1].float().to(z.device) * zk[:, j]
        return out.to(torch.bfloat16)


def make_backend() -> TorchBlockScaledBackend:
    return TorchBlockScaledBackend()
