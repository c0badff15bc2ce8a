"""torchao (prototype mx_formats) as a peer: its MX and NVFP4 quantizers, mode for mode, in the
reference's logical layout (one uint8 code per element, uint8 scale codes), on the CPU and, where there is
one, on the GPU (the same torch code, CUDA's arithmetic), plus its Triton MXFP8 cast where torchao enables it. Optional: install the
`torchao` extra (`pip install -e '.[test,torchao]'`, which `make test` does)."""

from __future__ import annotations

import warnings

import torch

from reference.formats import E2M1, E2M3, E3M2, E4M3FN, E5M2, FloatFormat
from reference.mx import ScaleMode
from reference.packing import unpack_fp4

__all__ = ["torchao_available", "torchao_quantize_mx", "torchao_quantize_nvfp4", "torchao_triton_mx_casts"]


def torchao_available() -> tuple[bool, str]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torchao.prototype.mx_formats.mx_tensor  # noqa: F401
    except Exception as exc:  # ImportError, or a torch/torchao mismatch at import
        return False, f"torchao is not importable here ({type(exc).__name__}: {exc})"
    return True, ""


def _elem_dtype(elem: FloatFormat):
    return {E2M1: torch.float4_e2m1fn_x2, E4M3FN: torch.float8_e4m3fn, E5M2: torch.float8_e5m2,
            E2M3: "fp6_e2m3", E3M2: "fp6_e3m2"}[elem]


def torchao_quantize_mx(x: torch.Tensor, elem: FloatFormat, scale_mode: ScaleMode,
                        device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(codes [x's shape] uint8, scales [..., K/32] uint8) from torchao's to_mx, blocks along the last dim,
    computed on `device` (torch's CUDA ops there), returned on the CPU."""
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import to_mx

    scale, data = to_mx(x.to(device), _elem_dtype(elem), 32, ScaleCalculationMode(scale_mode.value))
    raw = data.view(torch.uint8).cpu()
    codes = unpack_fp4(raw) if raw.numel() * 2 == x.numel() else raw
    return codes.reshape(x.shape), scale.view(torch.uint8).cpu().reshape(*x.shape[:-1], x.shape[-1] // 32)


def torchao_quantize_nvfp4(x: torch.Tensor, per_tensor_scale: torch.Tensor | None,
                           device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(codes uint8, E4M3 block-scale codes uint8) from torchao's nvfp4_quantize on `device`. torchao's
    per_tensor_scale is the decode direction (amax / 2688)."""
    from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize

    scales, data = nvfp4_quantize(x.to(device), 16, None if per_tensor_scale is None else per_tensor_scale.to(device))
    return unpack_fp4(data.view(torch.uint8).cpu()).reshape(x.shape), scales.view(torch.uint8).cpu().reshape(
        *x.shape[:-1], x.shape[-1] // 16)


def torchao_triton_mx_casts() -> tuple[object | None, str]:
    """torchao's Triton MXFP8 cast (triton_to_mxfp8_dim0: bf16 rows -> E4M3 codes, E8M0 scales), or None and
    why it is not usable here (torchao enables its Triton MX kernels on sm100+ with CUDA >= 12.8, or MI350)."""
    from torchao.prototype.mx_formats import kernels

    if not getattr(kernels, "_triton_kernels_available", False):
        return None, ("torchao enables its Triton MX casts on sm100+ (CUDA >= 12.8) or MI350 only "
                      "(torchao.prototype.mx_formats.kernels._triton_kernels_available is False here)")
    return kernels.triton_to_mxfp8_dim0, ""
