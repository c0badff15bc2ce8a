"""The truth: pure-PyTorch reference quantizers (and, later, the reference MoE).

Imports only torch. Returns logical layouts: one code per element, one scale per block; packing FP4
two per byte is `pack_fp4`; swizzled layouts belong to backends.
"""

from .formats import (
    E2M1,
    E2M3,
    E3M2,
    E4M3FN,
    E4M3FNUZ,
    E5M2,
    E5M2FNUZ,
    E8M0,
    FORMATS,
    FloatFormat,
    Overflow,
    Specials,
    decode,
    encode,
    format_by_name,
)
from .fp8 import FP8_FORMATS, FP8Quantized, Granularity, ScaleApply, dequantize_fp8, fp8_dynamic_scale, qdq_fp8, quantize_fp8
from .mx import MX_BLOCK_SIZE, MX_ELEMENT_FORMATS, MXQuantized, ScaleMode, dequantize_mx, mx_shared_exponent, qdq_mx, quantize_mx
from .nvfp4 import (
    NVFP4_BLOCK_SIZE,
    NVFP4Quantized,
    NVFP4Variant,
    dequantize_nvfp4,
    nvfp4_global_encode_scale,
    qdq_nvfp4,
    quantize_nvfp4,
)
from .packing import pack_fp4, unpack_fp4

__all__ = [name for name in dir() if not name.startswith("_")]
