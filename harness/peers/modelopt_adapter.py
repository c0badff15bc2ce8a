"""NVIDIA ModelOpt (the tool that writes NVFP4 and FP8 checkpoints: `weight_scale_2` = amax / 2688, the decode
direction) as a peer: its own NVFP4QTensor and FP8QTensor quantizers, pure torch, run on the CPU and returned in
the reference's logical layout (one uint8 code per element, uint8 scale codes). Optional: the `modelopt` extra
(`pip install -e '.[modelopt]'`, which `make test` does)."""

from __future__ import annotations

import torch

from harness.peers import installed

from reference.packing import unpack_fp4

__all__ = ["modelopt_available", "modelopt_quantize_nvfp4", "modelopt_dequantize_nvfp4", "modelopt_quantize_fp8"]


def modelopt_available() -> tuple[bool, str]:
    """Is the pinned nvidia-modelopt installed (found, not imported: its import takes ~5 s)."""
    return installed("nvidia-modelopt", "modelopt")


def modelopt_quantize_nvfp4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes [x's shape] uint8, E4M3 block-scale codes [..., K/16] uint8, weight_scale_2 fp32) from
    NVFP4QTensor.quantize(x, 16): what a ModelOpt NVFP4 checkpoint stores for weight x."""
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor

    qt, block_scales, global_decode = NVFP4QTensor.quantize(x, 16)
    codes = unpack_fp4(qt._quantized_data.view(torch.uint8)).reshape(x.shape)
    return codes, block_scales.view(torch.uint8).reshape(*x.shape[:-1], x.shape[-1] // 16), global_decode.float()


def modelopt_dequantize_nvfp4(codes: torch.Tensor, block_scales: torch.Tensor, global_decode: torch.Tensor,
                              dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """NVFP4QTensor.dequantize of the reference's logical layout (packed here the way ModelOpt packs)."""
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor

    packed = (codes[..., 1::2] << 4) | codes[..., 0::2]
    qt = NVFP4QTensor(codes.shape, dtype, packed)
    return qt.dequantize(dtype, scale=block_scales.view(torch.float8_e4m3fn), double_scale=global_decode,
                         block_sizes={-1: 16})


def modelopt_quantize_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(E4M3 codes uint8, per-tensor scale fp32) from FP8QTensor.quantize(x): scale = amax / 448."""
    from modelopt.torch.quantization.qtensor.fp8_tensor import FP8QTensor

    qt, scale = FP8QTensor.quantize(x)
    return qt._quantized_data.view(torch.uint8), scale.float()
