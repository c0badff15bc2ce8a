"""compressed-tensors (the library llm-compressor and vLLM use to write and read NVFP4 and FP8 checkpoints; NVFP4's
`weight_global_scale` = 2688 / amax, the encode direction) as a peer: its own scale helpers (generate_gparam,
calculate_qparams), its quantize / dequantize and its checkpoint compressors (NVFP4PackedCompressor,
FloatQuantizationCompressor), pure torch, run on the CPU and returned in the reference's logical layout (one uint8
code per element, uint8 scale codes). Optional: the `compressed-tensors` extra.

The per-group / per-channel / per-block min and max are reduced here with amin / amax: in a real run that is
llm-compressor's observer, which hands them to calculate_qparams exactly so (NVFP4 uses compressed-tensors' own
reduction, compute_dynamic_scales_and_zp). The zero points calculate_qparams returns (0 for these symmetric schemes)
go into the compressors' state as they do in a real run, where initialize_module_for_quantization registers
`weight_zero_point` by default (force_zero_point=True): the FP8 compressor adds it to x / scale."""

from __future__ import annotations

import torch

from harness.peers import installed

from reference.packing import pack_fp4, unpack_fp4

__all__ = ["compressed_tensors_available", "ct_quantize_nvfp4", "ct_dequantize_nvfp4", "ct_quantize_fp8",
           "ct_dequantize_fp8", "CT_FP8_STRATEGIES"]

# the three FP8 weight layouts compressed-tensors' presets write: FP8 (per tensor), FP8_DYNAMIC (per output
# channel), FP8_BLOCK (128 x 128 blocks)
CT_FP8_STRATEGIES = {"tensor": "FP8", "channel": "FP8_DYNAMIC", "block": "FP8_BLOCK"}


def compressed_tensors_available() -> tuple[bool, str]:
    """Is compressed-tensors installed (found, not imported: its import pulls in transformers, ~3 s)."""
    return installed("compressed-tensors", "compressed-tensors")


def _scheme(name: str):
    from compressed_tensors.quantization.quant_scheme import preset_name_to_scheme

    return preset_name_to_scheme(name, ["Linear"])


def _check_2d(x: torch.Tensor) -> None:
    if x.dim() != 2 or x.dtype != torch.float32:
        raise ValueError(f"compressed-tensors compresses one Linear weight: a 2-D float32 tensor, got "
                         f"{tuple(x.shape)} {x.dtype}")


def ct_quantize_nvfp4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes [x's shape] uint8, E4M3 block-scale codes [N, K/16] uint8, weight_global_scale fp32 [1]) as the NVFP4
    preset writes weight x [N, K]: generate_gparam(min, max) = fl(2688 / amax) (1.0 where that is not finite),
    calculate_qparams per 16 with that global scale, then NVFP4PackedCompressor.compress (quantize + pack)."""
    from compressed_tensors.compressors.nvfp4 import NVFP4PackedCompressor
    from compressed_tensors.quantization.utils.helpers import compute_dynamic_scales_and_zp, generate_gparam

    _check_2d(x)
    scheme = _scheme("NVFP4")
    global_scale = generate_gparam(x.amin(), x.amax())
    scale, zero_point = compute_dynamic_scales_and_zp(x, scheme.weights, None, global_scale=global_scale)
    state = NVFP4PackedCompressor.compress(
        {"weight": x, "weight_scale": scale, "weight_zero_point": zero_point, "weight_global_scale": global_scale},
        scheme)
    codes = unpack_fp4(state["weight_packed"])
    return codes, state["weight_scale"].view(torch.uint8), state["weight_global_scale"].float()


def ct_dequantize_nvfp4(codes: torch.Tensor, block_scales: torch.Tensor, global_scale: torch.Tensor,
                        dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """compressed-tensors' dequantize of the reference's logical layout, read as its checkpoint loader reads
    `weight_packed` (the reference's pack_fp4 bytes through its unpack_fp4_from_uint8, here to fp32 where the
    loader's default is bf16), given the encode-direction global scale."""
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
    from compressed_tensors.quantization.lifecycle.forward import dequantize

    n, k = codes.shape
    x_q = unpack_fp4_from_uint8(pack_fp4(codes), n, k, dtype=torch.float32)
    scale = block_scales.view(torch.float8_e4m3fn).float()
    return dequantize(x_q, scale, args=_scheme("NVFP4").weights, dtype=dtype, global_scale=global_scale)


def _fp8_min_max(x: torch.Tensor, strategy: str) -> tuple[torch.Tensor, torch.Tensor]:
    if strategy == "tensor":
        return x.amin(), x.amax()
    if strategy == "channel":
        return x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
    if strategy == "block":
        n, k = x.shape
        if n % 128 or k % 128:
            raise ValueError(f"block FP8 here needs both dims divisible by 128 (no padding), got {(n, k)}")
        g = x.reshape(n // 128, 128, k // 128, 128)
        return g.amin(dim=(1, 3)), g.amax(dim=(1, 3))
    raise ValueError(f"strategy must be one of {list(CT_FP8_STRATEGIES)}, got {strategy!r}")


def ct_quantize_fp8(x: torch.Tensor, strategy: str = "tensor") -> tuple[torch.Tensor, torch.Tensor]:
    """(E4M3 codes uint8 [x's shape], weight_scale fp32: [1], [N, 1] or [N/128, K/128]) as the FP8 / FP8_DYNAMIC /
    FP8_BLOCK preset writes weight x [N, K]: calculate_qparams(min, max) = fl(amax / 448) (2^-23 where 0), then
    FloatQuantizationCompressor.compress (quantize to float8_e4m3fn)."""
    from compressed_tensors.compressors.naive_quantized import FloatQuantizationCompressor
    from compressed_tensors.quantization.utils.helpers import calculate_qparams

    _check_2d(x)
    scheme = _scheme(CT_FP8_STRATEGIES[strategy])
    lo, hi = _fp8_min_max(x, strategy)
    scale, zero_point = calculate_qparams(lo, hi, scheme.weights)
    state = FloatQuantizationCompressor.compress(
        {"weight": x, "weight_scale": scale, "weight_zero_point": zero_point}, scheme)
    return state["weight"].view(torch.uint8), state["weight_scale"]


def ct_dequantize_fp8(codes: torch.Tensor, scale: torch.Tensor, strategy: str = "tensor") -> torch.Tensor:
    """compressed-tensors' dequantize of E4M3 codes (uint8) with the scale its preset for `strategy` stores."""
    from compressed_tensors.quantization.lifecycle.forward import dequantize

    return dequantize(codes.view(torch.float8_e4m3fn), scale, args=_scheme(CT_FP8_STRATEGIES[strategy]).weights)
