"""Triton kernels of the triton_emulation backend: bit-exact quantizers and a fused MoE whose GEMMs
dequantize weight codes inside the kernel.

One switch, INTERPRET, covers the CPU: TRITON_INTERPRET=1 must be set before any kernel is defined
(it is set here when no GPU is visible). Under the interpreter a bf16 tl.dot multiplies bit patterns,
so the dot runs on fp32 operands there (the operands are exactly representable in bf16 either way, so
the products are the same); compiled, it runs on bf16 tensor cores. fp32 -> bf16 conversion truncates
under the interpreter, so every bf16 rounding point uses round_bf16 (integer RNE) on both.

Numerics, all as the reference (reference/formats.py, mx.py, nvfp4.py, fp8.py):
- encode rounds with the fp32 adder: (y + C) - C with C = 2^(E - m + 23) rounds y to its binade's
  quantum half-to-even; codes come from integer arithmetic; no float8 casts, no log2.
- GEMM operands are code values times power-of-two block scales (exact in bf16); other scales (NVFP4
  and FP8 tensor scales, FP8 block scales) multiply the fp32 partial sums, never the operands.
"""

from __future__ import annotations

import os

from harness.platforms import has_gpu

if not has_gpu():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
INTERPRET_C = tl.constexpr(INTERPRET)  # (the same, readable inside a compiled kernel)
# Block factors in the bit-placement loop two a word, each product reading its factor's half in place
# (_scaled_halves_bf16_half: ptxas folds the half into the packed multiply's operand selector, HMUL2 R.H0_H0 / H1_H1),
# where doubling each factor into both halves cost a byte permute (NVFP4) or an extraction and a multiply (MX) a
# block: for Triton 3.6 on sm90 (tools/count_loop_instructions.py, gpt-oss-120b) NVFP4's K step 32 SASS fewer (decode
# 514 -> 482, the 8-warp prefill row 552 -> 520; Triton 3.9 523 -> 491), MXFP4's 16 (decode 439 -> 423, the prefill
# row 511 -> 495); the same products. Not yet timed on a GPU (results/gpu-issue28/run-41); MOE_CONFORMANCE_HALF_SELECT=0
# doubles the factors as before (A/B runs). The Gluon decode GEMM too since session 46 (gluon_kernels._tile_factor_halves).
HALF_SELECT = tl.constexpr(os.environ.get("MOE_CONFORMANCE_HALF_SELECT", "1") == "1")

# PDL_ORDER: the decode chain under programmatic dependent launch (Hopper's griddepcontrol; the Gluon backend's
# `pdl` launch parameter). A kernel launched as a dependent may start while the kernel before it still runs, once
# every program of that one has executed launch_dependents (or ended); its wait returns when that kernel has ended
# and its writes are visible. The chain and where each kernel triggers and waits:
#   moe_align_kernel (not a dependent)   triggers at entry
#   GEMM1 (bitplace_partials, PDL 1)     waits at entry, then triggers
#   splitk_epilogue_kernel               triggers at entry, then waits (GEMM2 may start under GEMM1's last wave);
#                                        absent with serial_k (GEMM1 finishes its tiles itself: GEMM2 is its dependent)
#   GEMM2 (bitplace_partials, PDL 2)     reads its block's expert and prefetches its weights into L2, then waits,
#                                        then triggers (the tiles' pdl 1); or as GEMM1, PDL 1 (the tiles' pdl 2)
#   splitk_topk_reduce_kernel            waits at entry, then triggers
# Every dependent waits before it reads its predecessor's output or writes anything (a buffer of the same forward
# may reuse a predecessor's memory). GEMM2's reads before its wait are of the weights and of moe_align_kernel's
# block_expert: the kernel before GEMM2 (the epilogue kernel, or GEMM1 itself with serial_k) starts, or triggers,
# only after GEMM1 passed its wait, which returns after moe_align_kernel ended, so the routing is complete before
# GEMM2 starts. Nothing waits for a kernel that waits for it: a
# dependent starts only after every program of its predecessor has started (no deadlock at any grid size).


def _device(fn):
    """Device helpers: @triton.jit when compiled; plain Python under the interpreter, where each call
    of a jitted helper re-patches the language module (that alone was two thirds of the CPU time)."""
    return fn if INTERPRET else triton.jit(fn)


# ---- exact fp32 helpers ------------------------------------------------------------------------


@_device
def _exp2i(e):
    """2^e (fp32) for int32 e in [-126, 127], from the exponent bits."""
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@_device
def _ldexp(x, k):
    """x * 2^k in two exact steps (|k| <= 252)."""
    k1 = k >> 1
    return x * _exp2i(k1) * _exp2i(k - k1)


@_device
def _floor_log2(x):
    """floor(log2 x) for x >= 0 from the exponent bits (fp32 subnormals included); 0 -> -150."""
    e = (x.to(tl.int32, bitcast=True) >> 23) & 0xFF
    xs = x * 18446744073709551616.0  # 2^64: lifts subnormals into the normal range, exactly
    es = ((xs.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 64
    e = tl.where(e == 0, es, e)
    return tl.where(x == 0, -150, e - 127)


@_device
def round_bf16(x):
    """fp32 -> nearest bf16 value (ties to even), as fp32; integer ops, so the interpreter agrees.
    NaN stays NaN: the rounding add would carry NVIDIA's canonical NaN 0x7FFFFFFF into the sign bit
    (-0.0, found on the H200 by the E8M0 0xFF special case; numpy's 0x7FC00000 does not carry)."""
    b = x.to(tl.uint32, bitcast=True)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return tl.where(x != x, 0x7FC00000, b).to(tl.float32, bitcast=True)


@_device
def bf16_to_f32(x):
    """bf16 -> fp32 through the bits (a shift): exact for subnormals, which the interpreter's own
    conversion gets wrong (Triton 3.9: 1.0837e-38 -> 9.918e-39)."""
    return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)


@_device
def _load_f32(ptr, offs, mask):
    """Values at ptr + offs (masked lanes 0) as fp32, exactly: bf16 through the bits (bf16_to_f32: the
    interpreter's own conversion gets subnormals wrong), other float dtypes by conversion."""
    x = tl.load(ptr + offs, mask=mask, other=0.0)
    if ptr.dtype.element_ty == tl.bfloat16:
        y = bf16_to_f32(x)
    else:
        y = x.to(tl.float32)
    return y


@_device
def f32_to_bf16(x):
    """A value already on the bf16 grid (round_bf16's output) as bf16, through the bits: exact for
    subnormals under the interpreter too."""
    return (x.to(tl.uint32, bitcast=True) >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)


@_device
def _grid_round(y, MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr):
    """y >= 0 (fp32, finite or +Inf) rounded to a format's grid (mbits, emin, emax), RNE, before saturation: the
    quantum 2^(e - MBITS) of y's exponent e clamped to [EMIN, EMAX + 1], by one rounding add. Also e_bits, that
    exponent in fp32's field."""
    e_bits = y.to(tl.int32, bitcast=True) & 0x7F800000
    e_bits = tl.minimum(tl.maximum(e_bits, (EMIN + 127) << 23), (EMAX + 1 + 127) << 23)
    c = (e_bits + ((23 - MBITS) << 23)).to(tl.float32, bitcast=True)
    return e_bits, (y + c) - c


@_device
def _encode_mag(y, MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr, MAX_CODE: tl.constexpr):
    """Magnitude code of y >= 0 (fp32, finite or +Inf) in a format (mbits, emin, emax), RNE, saturated."""
    e_bits, rounded = _grid_round(y, MBITS, EMIN, EMAX)
    # 2^(EMAX + 2) in e_bits' shape and layout (tl.full has none to give in a Gluon kernel's epilogue)
    clipped = tl.minimum(rounded, _exp2i(e_bits * 0 + (EMAX + 2)))
    inv_quantum = (((MBITS + 254) - (e_bits >> 23)) << 23).to(tl.float32, bitcast=True)
    n = (clipped * inv_quantum).to(tl.int32)
    code = ((e_bits >> 23) - (127 + EMIN)) * (1 << MBITS) + n
    return tl.minimum(code, MAX_CODE)


@_device
def _round_to_format(x, MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr, MAX_MANTISSA: tl.constexpr):
    """x (fp32, finite or infinite) as the value of its code in a format without Inf or NaN codes, sign kept (-0.0
    too), saturating at +-MAX_MANTISSA x 2^EMAX: _decode(_encode(x, 1.0, ...)) for a GEMM epilogue's values, from
    _encode_mag's rounding add and a clip, with no code computed."""
    bits = x.to(tl.int32, bitcast=True)
    e_bits, rounded = _grid_round((bits & 0x7FFFFFFF).to(tl.float32, bitcast=True), MBITS, EMIN, EMAX)
    # what rounds past the largest value saturates to it as the code does, +Inf too (in e_bits' layout: no tl.full)
    mag = tl.minimum(rounded, _exp2i(e_bits * 0 + EMAX) * MAX_MANTISSA)
    return (mag.to(tl.int32, bitcast=True) | (bits & -2147483648)).to(tl.float32, bitcast=True)


@_device
def _encode(x, p, MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr, MAX_CODE: tl.constexpr,
            SIGN_BIT: tl.constexpr, FNUZ: tl.constexpr):
    """Signed code of x * p (p a power of two or 1), saturating; x finite."""
    bits = x.to(tl.int32, bitcast=True)
    y = (bits & 0x7FFFFFFF).to(tl.float32, bitcast=True) * p
    mag = _encode_mag(y, MBITS, EMIN, EMAX, MAX_CODE)
    neg = bits < 0
    if FNUZ:
        neg = neg & (mag != 0)
    return tl.where(neg, mag | SIGN_BIT, mag)


@_device
def _decode(code, EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr):
    """Value of a (finite) signed minifloat code with subnormals, as fp32."""
    # normal codes map onto fp32 fields directly (exponent + 127 - BIAS, mantissa left-aligned); the
    # subnormal ones (exponent field 0) are m * 2^(1 - BIAS - MBITS); the sign goes to bit 31
    code = code.to(tl.int32)
    mag = code & ((1 << (EBITS + MBITS)) - 1)
    normal = ((mag << (23 - MBITS)) + ((127 - BIAS) << 23)).to(tl.float32, bitcast=True)
    sub = mag.to(tl.float32) * _exp2i(mag * 0 + (1 - BIAS - MBITS))  # (mag's layout: no tl.full in Gluon)
    v = tl.where(mag < (1 << MBITS), sub, normal)
    return (v.to(tl.int32, bitcast=True) | ((code >> (EBITS + MBITS)) << 31)).to(tl.float32, bitcast=True)


# ---- quantizer kernels -------------------------------------------------------------------------


@triton.jit
def _row_block_tile(n_rows, n_cols, group_size, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, pid_r, pid_c):
    """The tile of a quantizer program: BLOCK_M rows (row block pid_r) x one scale block of group_size
    columns (block pid_c; GROUP >= group_size, a power of two, lanes past group_size masked). int64 offsets."""
    rows = (pid_r * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    in_group = tl.arange(0, GROUP)
    cols = pid_c * group_size + in_group
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols) & (in_group[None, :] < group_size)
    return rows, mask, rows[:, None] * n_cols + cols[None, :]


@triton.jit
def mx_quantize_kernel(x_ptr, codes_ptr, scales_ptr, values_ptr, n_rows, n_cols, inv_max,
                       MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr, MAX_CODE: tl.constexpr,
                       SIGN_BIT: tl.constexpr, EBITS: tl.constexpr, BIAS: tl.constexpr, RCEIL: tl.constexpr,
                       WRITE_VALUES: tl.constexpr, BLOCK_M: tl.constexpr):
    """One program: BLOCK_M rows x one block of 32 columns. Writes codes and E8M0 scales, and with
    WRITE_VALUES the dequantized values (bf16, exact) for the GEMMs."""
    pid_b = tl.program_id(1)
    rows, mask, offs = _row_block_tile(n_rows, n_cols, 32, 32, BLOCK_M, tl.program_id(0), tl.program_id(1))
    x = _load_f32(x_ptr, offs, mask)  # bf16 activations or fp32 (the entry points)
    # a block holding NaN or Inf: checked per element (a max may drop NaNs)
    nonfinite = tl.max(((x != x) | (tl.abs(x) == float("inf"))).to(tl.int32), axis=1) > 0
    amax = tl.max(tl.where(nonfinite[:, None], 0.0, tl.abs(x)), axis=1)
    if RCEIL:
        d = amax * inv_max
        fl = _floor_log2(d)
        shared = fl + ((d != _ldexp(tl.full(d.shape, 1.0, tl.float32), tl.maximum(fl, -149))) & (d > 0)).to(tl.int32)
    else:
        shared = _floor_log2(amax) - EMAX
    shared = tl.minimum(tl.maximum(shared, -127), 127)
    xz = tl.where(nonfinite[:, None], 0.0, x)
    p = _ldexp(tl.full(shared.shape, 1.0, tl.float32), -shared)
    codes = _encode(xz, p[:, None], MBITS, EMIN, EMAX, MAX_CODE, SIGN_BIT, False)
    tl.store(codes_ptr + offs, codes.to(tl.uint8), mask=mask)
    scale = tl.where(nonfinite, 255, shared + 127)
    tl.store(scales_ptr + rows * (n_cols // 32) + pid_b, scale.to(tl.uint8), mask=rows < n_rows)
    if WRITE_VALUES:
        v = _ldexp(_decode(codes, EBITS, MBITS, BIAS), shared[:, None])
        tl.store(values_ptr + offs, f32_to_bf16(v), mask=mask)


@triton.jit
def nvfp4_quantize_kernel(x_ptr, codes_ptr, scales_ptr, values_ptr, s_dec_ptr, n_rows, n_cols,
                          WRITE_VALUES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr = 16,
                          WRITE_CODES: tl.constexpr = True):
    """NVFP4, one program per BLOCK_M rows x BLOCK_C columns (whole 16-column blocks; n_cols a multiple of 16, the
    blocks past it masked): E4M3 block scale from the block amax and the fp32 tensor scale (s_enc = fl(1 / s_dec)),
    E2M1 elements of fl(x / fl(stored * s_dec)). WRITE_VALUES stores e2m1 * stored (exact in bf16; s_dec is applied
    by the GEMM); WRITE_CODES False stores the values alone (a GEMM's activations: _nvfp4_block_values, the same
    bits with no codes' round trip, and no 1-byte scale stores)."""
    pid_c = tl.program_id(1)
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    offs = rows[:, None] * n_cols + cols[None, :]
    x = tl.reshape(_load_f32(x_ptr, offs, mask), (BLOCK_M, BLOCK_C // 16, 16))  # bf16 activations or fp32
    if WRITE_CODES:
        codes, stored, v = _nvfp4_blocks(x, tl.load(s_dec_ptr), 2)
        tl.store(codes_ptr + offs, tl.reshape(codes, (BLOCK_M, BLOCK_C)).to(tl.uint8), mask=mask)
        blocks = pid_c * (BLOCK_C // 16) + tl.arange(0, BLOCK_C // 16)
        tl.store(scales_ptr + rows[:, None] * (n_cols // 16) + blocks[None, :], stored.to(tl.uint8),
                 mask=(rows[:, None] < n_rows) & (blocks[None, :] < n_cols // 16))
    else:
        v = _nvfp4_block_values(x, tl.load(s_dec_ptr), 2)
    if WRITE_VALUES:
        tl.store(values_ptr + offs, f32_to_bf16(tl.reshape(v, (BLOCK_M, BLOCK_C))), mask=mask)


@_device
def _nvfp4_tile(x_ptr, s_dec_ptr, n_rows, n_cols, BLOCK_M: tl.constexpr, pid_r, pid_b):
    """Row block pid_r x 16-column block pid_b of x quantized to NVFP4 (_nvfp4_blocks): rows, mask, offsets,
    codes, block-scale codes and values."""
    rows, mask, offs = _row_block_tile(n_rows, n_cols, 16, 16, BLOCK_M, pid_r, pid_b)
    x = _load_f32(x_ptr, offs, mask)  # bf16 activations or fp32 (the entry points)
    codes, stored, v = _nvfp4_blocks(x, tl.load(s_dec_ptr), 1)
    return rows, mask, offs, codes, stored, v


@_device
def _nvfp4_scaled(x, s_dec, AXIS: tl.constexpr, CODES: tl.constexpr):
    """The NVFP4 block scale of fp32 x in blocks of 16 along its last axis AXIS: the E4M3 block-scale codes (AXIS
    reduced; 0 unless CODES), their values (AXIS kept) and x / fl(value * s_dec), the quotient E2M1 rounds (s_dec:
    the fp32 tensor scale, s_enc = fl(1 / s_dec))."""
    s_enc = tl.math.div_rn(1.0, s_dec)
    amax = tl.max(tl.abs(x), axis=AXIS)
    block = tl.math.div_rn(amax, 6.0) * s_enc
    if CODES:
        stored = _encode(block, 1.0, 3, -6, 8, 126, 128, False)  # E4M3FN: mbits 3, emin -6, emax 8, max 0x7E
        stored_v = tl.expand_dims(_decode(stored, 4, 3, 7), AXIS)
    else:
        stored = 0
        stored_v = tl.expand_dims(_round_to_format(block, 3, -6, 8, 1.75), AXIS)  # the same value, 448 at most
    denom = stored_v * s_dec
    safe = tl.where(denom == 0, 1.0, denom)
    return stored, stored_v, tl.where(denom == 0, x * 0.0, tl.math.div_rn(x, safe))


@_device
def _nvfp4_blocks(x, s_dec, AXIS: tl.constexpr):
    """NVFP4 of fp32 x in blocks of 16 along its last axis AXIS: E2M1 codes, the E4M3 block-scale codes (AXIS
    reduced) and the values e2m1 x stored, exact in bf16 (s_dec, the fp32 tensor scale, is the GEMM's)."""
    stored, stored_v, xs = _nvfp4_scaled(x, s_dec, AXIS, True)
    codes = _encode(xs, 1.0, 1, 0, 2, 7, 8, False)  # E2M1: mbits 1, emin 0, emax 2, max 0x7
    return codes, stored, _decode(codes, 2, 1, 1) * stored_v


@_device
def _nvfp4_block_values(x, s_dec, AXIS: tl.constexpr):
    """_nvfp4_blocks' values alone (a GEMM epilogue's, which stores no codes): the same bits without the codes'
    integer round trips (_round_to_format)."""
    _, stored_v, xs = _nvfp4_scaled(x, s_dec, AXIS, False)
    return _round_to_format(xs, 1, 0, 2, 1.5) * stored_v  # E2M1: 6 at most


@triton.jit
def fp8_quantize_kernel(x_ptr, codes_ptr, scale_ptr, values_ptr, n_rows, n_cols, n_groups, group_size, fmax, min_scale,
                        MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr, MAX_CODE: tl.constexpr,
                        SIGN_BIT: tl.constexpr, FNUZ: tl.constexpr, EBITS: tl.constexpr, BIAS: tl.constexpr,
                        DYNAMIC: tl.constexpr, GROUP: tl.constexpr, WRITE_VALUES: tl.constexpr,
                        BLOCK_M: tl.constexpr):
    """FP8 of fl(x / scale) clamped to +-fmax. DYNAMIC: one scale per row and GROUP columns (a power of
    two; masked past n_cols), max(fl(amax / fmax), min_scale), written to scale_ptr [rows, n_groups]; else
    one static scale
    at scale_ptr. WRITE_VALUES stores the code values (exact in bf16; the scale is the GEMM's)."""
    pid_b = tl.program_id(1)
    rows, mask, offs = _row_block_tile(n_rows, n_cols, group_size, GROUP, BLOCK_M, tl.program_id(0),
                                     tl.program_id(1))
    x = _load_f32(x_ptr, offs, mask)  # bf16 activations or fp32 (the entry points)
    if DYNAMIC:
        amax = tl.max(tl.abs(x), axis=1)
        s = tl.maximum(tl.math.div_rn(amax, fmax), min_scale)
        tl.store(scale_ptr + rows * n_groups + pid_b, s, mask=rows < n_rows)
        xs = tl.math.div_rn(x, s[:, None])
    else:
        s = tl.load(scale_ptr)
        xs = tl.math.div_rn(x, s)
    xs = tl.minimum(tl.maximum(xs, -fmax), fmax)
    codes = _encode(xs, 1.0, MBITS, EMIN, EMAX, MAX_CODE, SIGN_BIT, FNUZ)
    tl.store(codes_ptr + offs, codes.to(tl.uint8), mask=mask)
    if WRITE_VALUES:
        tl.store(values_ptr + offs, f32_to_bf16(_decode(codes, EBITS, MBITS, BIAS)), mask=mask)


# ---- fused MoE ---------------------------------------------------------------------------------

# weight kinds
W_BF16: tl.constexpr = 0
W_MX: tl.constexpr = 1
W_NVFP4: tl.constexpr = 2
W_FP8: tl.constexpr = 3


@_device
def _weight_tile(w_ptr, ws_ptr, expert, wrow, k0, n_mask, N_ROWS, K,
                 W_KIND: tl.constexpr, PACKED: tl.constexpr, EBITS: tl.constexpr, MBITS: tl.constexpr,
                 BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, RAW_BF16: tl.constexpr = False):
    """[BLOCK_N, BLOCK_K] weight values for rows `wrow` of `expert`, dequantized in registers: code
    value times its power-of-two (MX) or E4M3 (NVFP4) block scale, exact in bf16. FP8 block and tensor
    scales are not applied here. RAW_BF16 (compiled): bf16 weights as loaded, so that the load feeds the MMA
    (the pipeliner streams it into shared memory for wgmma) instead of passing through registers."""
    e64 = expert.to(tl.int64)
    k_offs = k0 + tl.arange(0, BLOCK_K)
    m2 = n_mask[:, None] & (k_offs < K)[None, :]
    if W_KIND == 0:  # one return for every kind (Triton types a function's returns together)
        offs = e64 * N_ROWS * K + wrow[:, None].to(tl.int64) * K + k_offs[None, :]
        v = tl.load(w_ptr + offs, mask=m2, other=0.0)
        if not RAW_BF16:
            v = bf16_to_f32(v)
    else:
        if PACKED:
            # each byte once: [BN, BK/2] bytes, both nibbles decoded, interleaved back (low nibble = even k)
            kb = k0 // 2 + tl.arange(0, BLOCK_K // 2)
            offs = e64 * N_ROWS * (K // 2) + wrow[:, None].to(tl.int64) * (K // 2) + kb[None, :]
            byte = tl.load(w_ptr + offs, mask=n_mask[:, None] & (kb < K // 2)[None, :], other=0).to(tl.int32)
            lo = _decode(byte & 0xF, EBITS, MBITS, BIAS)
            hi = _decode(byte >> 4, EBITS, MBITS, BIAS)
            v = tl.reshape(tl.join(lo, hi), (BLOCK_N, BLOCK_K))
        else:
            offs = e64 * N_ROWS * K + wrow[:, None].to(tl.int64) * K + k_offs[None, :]
            code = tl.load(w_ptr + offs, mask=m2, other=0).to(tl.int32)
            v = _decode(code, EBITS, MBITS, BIAS)
        if W_KIND == 1:
            # one E8M0 scale per 32 weights: 2^(s - 127) as two exact power-of-two factors, NaN for 0xFF
            sk = k0 // 32 + tl.arange(0, BLOCK_K // 32)
            s_offs = e64 * N_ROWS * (K // 32) + wrow[:, None].to(tl.int64) * (K // 32) + sk[None, :]
            s = tl.load(ws_ptr + s_offs, mask=n_mask[:, None] & (sk < K // 32)[None, :], other=127).to(tl.int32)
            # 2^(s - 127) as one fp32 factor per block: exponent bits for s in 1..254, the subnormal 2^-127
            # for s = 0, NaN for 0xFF; one exact multiply per weight
            f = tl.where(s == 0, 0x00400000, s << 23).to(tl.float32, bitcast=True)
            f = tl.where(s == 255, float("nan"), f)
            v3 = tl.reshape(v, (BLOCK_N, BLOCK_K // 32, 32))
            v = tl.reshape(v3 * f[:, :, None], (BLOCK_N, BLOCK_K))
        if W_KIND == 2:
            sk = k0 // 16 + tl.arange(0, BLOCK_K // 16)
            s_offs = e64 * N_ROWS * (K // 16) + wrow[:, None].to(tl.int64) * (K // 16) + sk[None, :]
            s = tl.load(ws_ptr + s_offs, mask=n_mask[:, None] & (sk < K // 16)[None, :], other=0)
            f = _decode(s, 4, 3, 7)
            v = tl.reshape(tl.reshape(v, (BLOCK_N, BLOCK_K // 16, 16)) * f[:, :, None], (BLOCK_N, BLOCK_K))
    return v


@_device
def _place_pairs(word):
    """The four bf16x2 bit patterns (value x 2^-126 in each half: sign at bits 15 / 31, magnitude at 6..8 /
    22..24) of the eight E2M1 codes in a stored word (uint32), whose bits triton_bitplace.CODE_BITS placed so
    that pairs 0, 1, 2 need one shift and one AND each and pair 3 three of each: 11 integer operations."""
    p0 = word & 0x81C081C0
    p1 = (word << 3) & 0x81C081C0
    p2 = (word << 6) & 0x81C081C0
    p3 = ((word >> 4) & 0x00C000C0) | ((word >> 5) & 0x01000100) | ((word << 1) & 0x80008000)
    return (p0.to(tl.int32, bitcast=True), p1.to(tl.int32, bitcast=True), p2.to(tl.int32, bitcast=True),
            p3.to(tl.int32, bitcast=True))


@_device
def _bytes_of_words(words):
    """int32 words [...] -> their bytes [..., 2, 2] (int32; flattened, little-endian order)."""
    b0, b1, b2, b3 = words & 0xFF, (words >> 8) & 0xFF, (words >> 16) & 0xFF, (words >> 24) & 0xFF
    return tl.join(tl.join(b0, b2), tl.join(b1, b3))


@_device
def _mma_rows(n0, REPS: tl.constexpr):
    """Output rows n of a [64 * REPS] weight tile, as [8, 4, REPS, 2] (g, warp, rep, h): n = n0 + 64 rep + 16 warp
    + 8 h + g. A load of [8, 4, REPS, 2, 16 words] gets its lanes on g and the words (4 each: one 16-byte load)
    and its warps on `warp` (the compiler fills lanes, then warps, along the contiguous dim first and then in
    dim order): warp `warp` holding rows 16 warp + {g, g + 8}, lane 4g + t holding words 4t..4t+3 of each, the
    threads that the wgmma register operand wants for those rows (tools/count_loop_instructions.py shows it)."""
    g = tl.arange(0, 8)[:, None, None, None]
    warp = tl.arange(0, 4)[None, :, None, None]
    rep = tl.arange(0, REPS)[None, None, :, None]
    h = tl.arange(0, 2)[None, None, None, :]
    return n0 + 64 * rep + 16 * warp + 8 * h + g


@_device
def _to_mma_order(x, REPS: tl.constexpr, INNER: tl.constexpr):
    """[8, 4, REPS, 2, INNER] in _mma_rows' order -> [64 * REPS, INNER] in row order (a register relabel)."""
    return tl.reshape(tl.permute(x, (2, 1, 3, 0, 4)), (64 * REPS, INNER))


@_device
def _fp4_bitplace_tile(w_ptr, ws_ptr, expert, n0, ROW_MUL: tl.constexpr, ROW_ADD, n_limit, ci, N_ROWS, K,
                       W_KIND: tl.constexpr, REPS: tl.constexpr, INTERPRET_DOT: tl.constexpr, QW: tl.constexpr = 4,
                       QH: tl.constexpr = 0, ROW_PAIRS: tl.constexpr = False, NV_NORMAL: tl.constexpr = False):
    """_fp4_bitplace_decode of the block scale words _fp4_scale_words loads for the same rows and chunk."""
    sw = _fp4_scale_words(ws_ptr, expert, n0, ROW_MUL, ROW_ADD, n_limit, ci, N_ROWS, K, W_KIND, REPS, QW, QH,
                          ROW_PAIRS, False)
    return _fp4_bitplace_decode(w_ptr, sw, expert, n0, ROW_MUL, ROW_ADD, n_limit, ci, N_ROWS, K, W_KIND, REPS,
                                INTERPRET_DOT, QW, QH, ROW_PAIRS, NV_NORMAL)


@_device
def _fp4_scale_words(ws_ptr, expert, n0, ROW_MUL: tl.constexpr, ROW_ADD, n_limit, ci, N_ROWS, K, W_KIND: tl.constexpr,
                     REPS: tl.constexpr, QW: tl.constexpr, QH: tl.constexpr, ROW_PAIRS: tl.constexpr,
                     BY_REGISTERS: tl.constexpr):
    """The block scales of _fp4_bitplace_decode's rows and chunk ci, as the int32 words prepare() stored: 4 (MX,
    32 values) or 8 (NVFP4, 16 values) bytes per chunk and row, loaded in the rows' order of the codes (no layout
    conversion); MX [8, 4, REPS, 2] (one word), NVFP4 [8, 4, REPS, 2, QW / 2]; rows past n_limit 0.
    BY_REGISTERS (compiled, QW 4): by plain loads (ld.global.nc, NVFP4's two words as one 8-byte load), which
    Triton's pipeliner does not stream through shared memory: the K loop's SCALE_REGS loads chunk ci + 1's words
    one step ahead into registers. That frees the scales' share of the pipeline's buffers (NVFP4's 128-row 4-warp
    GEMM1: 114 -> 112 KB, two programs a multiprocessor, where 113 KB is the most that lets two fit). Rows past
    n_limit then read row n_limit - 1's words instead of 0: their codes load as 0, so their weights are 0 all the
    same (a zero code times any finite factor; prepare() refuses NaN scales), and their outputs are never stored."""
    e64 = expert.to(tl.int64)
    n = _mma_rows(n0, REPS)
    if BY_REGISTERS:
        tl.static_assert(QW == 4, "scales by registers: one MMA step a chunk")
        n = tl.minimum(n, n_limit - 1)  # every address inside the tensor: no masked loads in inline PTX
    row = (n * ROW_MUL + ROW_ADD).to(tl.int64)
    rmask = n < n_limit
    chunks = (K + 127) // 128
    SW: tl.constexpr = 1 if W_KIND == 1 else 2
    s32 = ws_ptr.to(tl.pointer_type(tl.int32))
    if ROW_PAIRS:
        row_base = e64 * N_ROWS * (chunks * SW) + (row // 2) * (chunks * 2 * SW) + (row % 2) * SW
        chunk_words: tl.constexpr = 2 * SW
    else:
        row_base = e64 * N_ROWS * (chunks * SW) + row * (chunks * SW)
        chunk_words: tl.constexpr = SW
    if BY_REGISTERS:
        # each row's address without the chunk first (loop-invariant, hoisted), then the chunk's 32-bit offset (one
        # IMAD.WIDE a load, where the 64-bit index sum took an add pair and a shift-add pair: NVFP4's 4-warp tile's K
        # step 543 -> 530 SASS, Triton 3.6 for sm90)
        if W_KIND == 1:
            words = tl.inline_asm_elementwise("ld.global.nc.b32 $0, [$1];", "=r,l",
                                              [(s32 + row_base) + ci * chunk_words], dtype=tl.int32, is_pure=True,
                                              pack=1)
        else:  # the row's two words, 8-byte aligned (row_base even)
            s64 = ws_ptr.to(tl.pointer_type(tl.int64))
            both = tl.inline_asm_elementwise("ld.global.nc.b64 $0, [$1];", "=l,l",
                                             [(s64 + row_base // 2) + ci * (chunk_words // 2)], dtype=tl.int64,
                                             is_pure=True, pack=1)
            words = tl.join(both.to(tl.int32), (both >> 32).to(tl.int32))  # word 0 the low half (little-endian)
    elif W_KIND == 1:
        words = tl.load((s32 + row_base) + ci * chunk_words, mask=rmask, other=0)
    else:
        SWP: tl.constexpr = QW // 2  # scale words of this part
        words = tl.load((s32 + row_base)[:, :, :, :, None] + (ci * chunk_words + SWP * QH) +
                        tl.arange(0, SWP)[None, None, None, None, :], mask=rmask[:, :, :, :, None], other=0)
    return words


@_device
def _fp4_bitplace_decode(w_ptr, sw, expert, n0, ROW_MUL: tl.constexpr, ROW_ADD, n_limit, ci, N_ROWS, K,
                         W_KIND: tl.constexpr, REPS: tl.constexpr, INTERPRET_DOT: tl.constexpr, QW: tl.constexpr = 4,
                         QH: tl.constexpr = 0, ROW_PAIRS: tl.constexpr = False, NV_NORMAL: tl.constexpr = False):
    """[64 * REPS, 32 QW] FP4 weights of rows ROW_MUL * n + ROW_ADD (n = n0 .. n0 + 64 REPS - 1), chunk ci of K
    (QW = 4), or its columns [32 QW QH, 32 QW (QH + 1)) (QW = 2: words 4t + 2 QH, +1 of each thread-group), their
    block scales the words sw (_fp4_scale_words of the same rows and chunk),
    by bit placement (harness/backends/fp4_bits.py, checked exhaustively), from the layout that
    triton_bitplace.mma_order_codes wrote: in each 128-value chunk of a row, thread-group t's 32 codes (columns
    16j + 2t + {0, 1, 8, 9}, the wgmma register operand's) are words 4t..4t+3, so one 16-byte load per row and
    thread feeds its MMA registers with no layout conversion, each pair of adjacent columns 16 bits apart in a word. Each E2M1 code's sign and magnitude bits are
    placed into a 16-bit float (value x 2^-126), then
      MXFP4 (W_KIND 1): one multiply by 2^(s - 1), the E8M0 block scale with the 2^126 bias folded in (exact
                        for s <= 128, which prepare() checks); prepare() stores s + 126, the exponent field
                        of 2^(s - 1), so the factor is that byte placed at bit 7
      NVFP4 (W_KIND 2): one multiply by the E4M3 block scale times 2^119 (placed: value x 2^-120, then
                        x 2^127 and x 2^112, per scale rather than per value), so each weight is its value
                        x 2^-7: every product of an E2M1 and an E4M3 value is a bf16 value, and x 2^-7 keeps the
                        smallest (0.5 x 2^-9) normal and s x 2^119 below bf16's largest; prepare() folds the
                        2^7 back into the per-expert global scale that multiplies the accumulator.
    NV_NORMAL: every NVFP4 block scale of the launch is a normal E4M3 number: the factor's exponent by an integer add
    (_nvfp4_factor_words).
    ROW_PAIRS: rows 2m and 2m + 1 stored chunk by chunk side by side (triton_bitplace.pair_rows), so that the lanes
    of rows g = 0 and 1 (lanes 0-7) read one whole 128-byte line of codes per load, and the scales likewise.
    Compiled, each block's factor is built once as the bf16x2 word the packed multiply takes (both halves the
    factor): MX by one integer multiply of the scale byte (x 0x00800080), NVFP4 by one byte permute (prmt) per
    block of the placed pairs, rather than extracting 16-bit factors and duplicating them at each multiply (issue 28:
    K loop MXFP4 462 -> 446, NVFP4 560 -> 528 SASS; on the H200 bit for bit the old outputs and no slower,
    results/gpu-issue28/run-4); with HALF_SELECT, NVFP4's factors stay two a word (even and odd blocks) and each
    multiply reads its half through the operand selector, no permute at all (_scaled_by_half_q).
    bf16 on the GPU; fp32 (the same placement, 16 bits higher) under the interpreter, whose bf16 is unsound."""
    e64 = expert.to(tl.int64)
    n = _mma_rows(n0, REPS)
    row = (n * ROW_MUL + ROW_ADD).to(tl.int64)
    rmask = n < n_limit
    chunks = (K + 127) // 128  # rows padded to whole 128-value chunks by prepare()
    w32 = w_ptr.to(tl.pointer_type(tl.int32))
    if ROW_PAIRS:
        wbase = e64 * N_ROWS * (chunks * 16) + (row // 2) * (chunks * 32) + ci * 32 + (row % 2) * 16
    else:
        wbase = e64 * N_ROWS * (chunks * 16) + row * (chunks * 16) + ci * 16
    if QW == 4:
        woffs = tl.arange(0, 16)
    else:
        widx = tl.arange(0, 4 * QW)
        woffs = 4 * (widx // QW) + QW * QH + widx % QW  # thread-group t's words 4t + QW QH ..
    word = tl.load(w32 + wbase[:, :, :, :, None] + woffs[None, None, None, None, :],
                   mask=rmask[:, :, :, :, None], other=0).to(tl.uint32, bitcast=True)
    # the factor of each block as bf16 bits (int32): MX 2^(s - 1), the stored exponent field s + 126 placed at
    # bit 7; NVFP4 the E4M3 value x 2^119 (placed: value x 2^-120, then x 2^127 and x 2^112, exact)
    if W_KIND == 1:
        sword = sw >> (8 * QW * QH)  # this part's blocks in the low bytes
        if HALF_SELECT and QW == 4:  # 2^(s - 1) of blocks 0, 2 (even) and 1, 3 (odd) as the halves of two words
            mx_even = (sword << 7) & 0x7F807F80
            mx_odd = (sword >> 1) & 0x7F807F80  # (an arithmetic shift's sign bit lands outside the mask)
        else:
            if QW == 4:
                sbytes = tl.reshape(_bytes_of_words(sword), (8, 4, REPS, 2, 1, 4))
            else:
                sbytes = tl.reshape(tl.join(sword & 0xFF, (sword >> 8) & 0xFF), (8, 4, REPS, 2, 1, 2))
            if INTERPRET_DOT:
                fbits = sbytes << 7
            else:
                fbits = sbytes * 0x00800080  # (s + 126) << 7 in both halves: 2^(s - 1) as a bf16x2 word
    else:
        SWP: tl.constexpr = QW // 2  # scale words of this part
        if INTERPRET_DOT:
            sbytes = tl.reshape(_bytes_of_words(sw), (8, 4, REPS, 2, 1, 4 * SWP))
            if NV_NORMAL == 2:  # the codes were stored plus triton_bitplace._NV_BIAS, each word rotated left by 4
                sbytes = tl.reshape(_bytes_of_words(((sw >> 4) & 0x0FFFFFFF) | (sw << 28)),
                                    (8, 4, REPS, 2, 1, 4 * SWP)) - 0x78
            e4m3 = ((((sbytes & 0x7F) << 4) | ((sbytes & 0x80) << 8)) << 16).to(tl.float32, bitcast=True)
            e4m3 = (e4m3 * 1.7014118346046923e38) * 5.192296858534828e33  # x 2^127 x 2^112: s x 2^119
            fbits = (e4m3.to(tl.uint32, bitcast=True) >> 16).to(tl.int32)
            if HALF_SELECT:  # the compiled path's words: block 4w + 2j + i in half j of word w's even (i 0) / odd
                fe, fo = tl.split(tl.reshape(fbits, (8, 4, REPS, 2, 1, SWP, 2, 2)))
                fe_lo, fe_hi = tl.split(fe)
                fo_lo, fo_hi = tl.split(fo)
                even = fe_lo | (fe_hi << 16)
                odd = fo_lo | (fo_hi << 16)
        elif HALF_SELECT:
            even, odd = _nvfp4_factor_halves(sw, NV_NORMAL)
        else:
            d0, d1, d2, d3 = _nvfp4_factor_words(sw, NV_NORMAL)
            fbits = tl.reshape(_in_order(d0, d1, d2, d3), (8, 4, REPS, 2, 1, 4 * SWP))
    # codes n = 4 i0 + p of word 4t + q -> their 16-bit float bits; codes p and p + 4 (columns c and c + 1) placed
    # together into one 32-bit word, the bf16x2 register that the MMA takes
    p0, p1, p2, p3 = _place_pairs(tl.reshape(word, (8, 4, REPS, 2, 4, QW)))
    # MX: every pair of word (t, q) is in block q; NVFP4: pairs n = 0, 1 in block 2q, pairs 2, 3 in block 2q + 1
    if W_KIND == 1 and HALF_SELECT and QW == 4:
        # every pair of word q is in block q = 2 j + i: half j of the even (i 0) or odd (i 1) word, read in place;
        # under the interpreter the same words in fp32 (_scaled_halves_f32)
        ev = tl.broadcast_to(tl.reshape(mx_even, (8, 4, REPS, 2, 1, 1)), (8, 4, REPS, 2, 4, 1))
        od = tl.broadcast_to(tl.reshape(mx_odd, (8, 4, REPS, 2, 1, 1)), (8, 4, REPS, 2, 4, 1))
        lo0, hi0 = _mx_scaled_by_block(p0, ev, od, REPS, INTERPRET_DOT)
        lo1, hi1 = _mx_scaled_by_block(p1, ev, od, REPS, INTERPRET_DOT)
        lo2, hi2 = _mx_scaled_by_block(p2, ev, od, REPS, INTERPRET_DOT)
        lo3, hi3 = _mx_scaled_by_block(p3, ev, od, REPS, INTERPRET_DOT)
    elif W_KIND == 2 and HALF_SELECT:
        # block 2q (2q + 1) is half q % 2 of even (odd) word q // 2: each product reads its half in place
        ev = tl.broadcast_to(tl.reshape(even, (8, 4, REPS, 2, 1, SWP)), (8, 4, REPS, 2, 4, SWP))
        od = tl.broadcast_to(tl.reshape(odd, (8, 4, REPS, 2, 1, SWP)), (8, 4, REPS, 2, 4, SWP))
        lo0, hi0 = _scaled_by_half_q(p0, ev, REPS, SWP, INTERPRET_DOT)
        lo1, hi1 = _scaled_by_half_q(p1, ev, REPS, SWP, INTERPRET_DOT)
        lo2, hi2 = _scaled_by_half_q(p2, od, REPS, SWP, INTERPRET_DOT)
        lo3, hi3 = _scaled_by_half_q(p3, od, REPS, SWP, INTERPRET_DOT)
    else:
        if W_KIND == 1:
            f01 = tl.broadcast_to(fbits, (8, 4, REPS, 2, 4, QW))
            f23 = f01
        else:
            f01, f23 = tl.split(tl.reshape(fbits, (8, 4, REPS, 2, 1, QW, 2)))
            f01 = tl.broadcast_to(f01, (8, 4, REPS, 2, 4, QW))
            f23 = tl.broadcast_to(f23, (8, 4, REPS, 2, 4, QW))
        if INTERPRET_DOT:
            # the fp32 twin: each 16-bit pattern 16 bits up is the same value; the same exact products
            lo0, hi0 = _scaled_halves_f32(p0, f01)
            lo1, hi1 = _scaled_halves_f32(p1, f01)
            lo2, hi2 = _scaled_halves_f32(p2, f23)
            lo3, hi3 = _scaled_halves_f32(p3, f23)
        else:
            lo0, hi0 = _scaled_halves_bf16(p0, f01)
            lo1, hi1 = _scaled_halves_bf16(p1, f01)
            lo2, hi2 = _scaled_halves_bf16(p2, f23)
            lo3, hi3 = _scaled_halves_bf16(p3, f23)
    # pair n = 2 i2 + i1, half i0: joined as [.., i2, i1, i0]
    w = tl.join(tl.join(tl.join(lo0, lo2), tl.join(lo1, lo3)), tl.join(tl.join(hi0, hi2), tl.join(hi1, hi3)))
    # [.., 4 t, 4 q, 8 (i2, i1, i0)] -> columns 32q + 16 i2 + 8 i1 + 2t + i0 (the stored order's inverse):
    # (t, q i2 i1, i0) -> (q i2 i1, t, i0), then the rows in order: register relabels
    w = tl.permute(tl.reshape(w, (8, 4, REPS, 2, 4, 4 * QW, 2)), (0, 1, 2, 3, 5, 4, 6))
    return _to_mma_order(tl.reshape(w, (8, 4, REPS, 2, 32 * QW)), REPS, 32 * QW)


@_device
def _nvfp4_factor_words(sw, NORMAL: tl.constexpr = False):
    """The factors of the four NVFP4 blocks whose E4M3 scales are the bytes 0..3 of each int32 word sw: each the
    scale's value x 2^119 as bf16 bits in both halves of a word (the bf16x2 the packed multiply takes). Bytes (0, 2)
    and (1, 3) are placed two at a time as bf16x2 words (value x 2^-120), two packed multiplies each, by 2^127 and
    2^112 (in that order nothing leaves bf16's range; exact), then each half duplicated by a byte permute.
    NORMAL (every scale of the launch a normal E4M3 number, exponent field 1..15: prepare() checks): the placed
    exponent field e moves to e + 239 by an integer add instead of the multiplies (the same bits: 2^-120 x 2^239;
    at most 254 with the magnitude below the sign bit, no carry into the high half); a zero or subnormal scale
    (e = 0) would come out as 2^112 x (1 + m / 8), hence the check."""
    even, odd = _nvfp4_factor_halves(sw, NORMAL)
    d0, d2 = _dup_halves(even)  # blocks 0 and 2 are even's halves, 1 and 3 odd's
    d1, d3 = _dup_halves(odd)
    return d0, d1, d2, d3


@_device
def _nv_biased_factor_pairs(shifted):
    """(shifted & 0x0FF00FF0) | 0x70007000: two biased E4M3 codes at bits 4-11 and 20-27, their bf16 factors'
    exponent top bits or'ed in. Compiled, one three-input LOP3 (lop3.b32's LUT 0xEA, (a & b) | c) where Triton's and-then-or took two,
    each with its own immediate (Triton 3.6, sm90: NVFP4 K step 13-15 SASS fewer: decode 458 -> 443, the Gluon decode
    GEMM 394 -> 379, the 8-warp prefill row 496 -> 481); the same bits."""
    if INTERPRET_C:
        return (shifted & 0x0FF00FF0) | 0x70007000
    else:
        return tl.inline_asm_elementwise("lop3.b32 $0, $1, 0x0FF00FF0, 0x70007000, 0xEA;", "=r,r", [shifted],
                                         dtype=tl.int32, is_pure=True, pack=1)


@_device
def _rotate_right_8(w):
    """The int32 word w rotated right by 8 bits. Compiled, one funnel shift (shf.r.wrap: SHF.R.W.U32); Triton's
    shift-and-or of an int32 would take two shifts and an or."""
    if INTERPRET_C:
        return ((w >> 8) & 0x00FFFFFF) | (w << 24)
    else:
        return tl.inline_asm_elementwise("shf.r.wrap.b32 $0, $1, $1, 8;", "=r,r", [w], dtype=tl.int32, is_pure=True,
                                         pack=1)


@_device
def _nvfp4_factor_halves(sw, NORMAL: tl.constexpr = False):
    """_nvfp4_factor_words' factors before the duplication: (even, odd), the factors of blocks 0 and 2 (1 and 3)
    as the low and high halves of one word. NORMAL 2: the bytes are positive normal codes stored plus 0x78
    (triton_bitplace._NV_BIAS), (e + 15) << 3 | m, and each factor is its byte 4 bits up with 0x7000 or'ed in:
    exponent field 224 + e + 15 = e + 239, mantissa m << 4. The stored words are rotated left by 4 bits, so bytes 0
    and 2 are already 4 bits up (even: one LOP3) and bytes 1 and 3 get there by one 8-bit rotate (odd: a funnel shift
    and a LOP3): 8 SASS fewer a K step than a shift before each (Triton 3.6, sm90: the 8-warp prefill row 481 -> 473,
    decode 443 -> 435, the Gluon decode GEMM 379 -> 371)."""
    if NORMAL == 2:  # the stored words rotated left by 4 (triton_bitplace._rotate_words_left_4)
        even = _nv_biased_factor_pairs(sw)
        odd = _nv_biased_factor_pairs(_rotate_right_8(sw))
    elif NORMAL:
        even = (((sw & 0x007F007F) << 4) + 0x77807780) | ((sw & 0x00800080) << 8)
        odd = ((((sw >> 8) & 0x007F007F) << 4) + 0x77807780) | (((sw >> 8) & 0x00800080) << 8)
    else:
        even = _mul_bf16x2(_mul_bf16x2(((sw & 0x007F007F) << 4) | ((sw & 0x00800080) << 8), 0x7F007F00), 0x77807780)
        odd = _mul_bf16x2(_mul_bf16x2((((sw >> 8) & 0x007F007F) << 4) | (((sw >> 8) & 0x00800080) << 8),
                                      0x7F007F00), 0x77807780)
    return even, odd


@_device
def _scaled_halves_bf16_half(pair, fword, HALF: tl.constexpr):
    """_scaled_halves_bf16 by the factor in half HALF of fword (not duplicated): ptxas reads it through the packed
    multiply's operand selector (HMUL2 ... R.H0_H0 / R.H1_H1), no byte permute."""
    if HALF == 0:
        asm: tl.constexpr = ("{ .reg .b16 l, h; .reg .b32 f, p; mov.b32 {l, h}, $3; mov.b32 f, {l, l}; "
                             "mul.rn.bf16x2 p, $2, f; mov.b32 {$0, $1}, p; }")
    else:
        asm: tl.constexpr = ("{ .reg .b16 l, h; .reg .b32 f, p; mov.b32 {l, h}, $3; mov.b32 f, {h, h}; "
                             "mul.rn.bf16x2 p, $2, f; mov.b32 {$0, $1}, p; }")
    return tl.inline_asm_elementwise(asm, "=h,=h,r,r", [pair, fword], dtype=(tl.bfloat16, tl.bfloat16),
                                     is_pure=True, pack=1)


@_device
def _scaled_by_half_q(p, fw, REPS: tl.constexpr, SWP: tl.constexpr, INTERPRET_DOT: tl.constexpr):
    """Placed pairs p [8, 4, REPS, 2, 4 t, 2 SWP q] times their NVFP4 block factors: word q = 2 qa + qb by half qb
    of fw[..., qa] ([8, 4, REPS, 2, 4, SWP], _nvfp4_factor_halves' even or odd words) -> (lo, hi) as p; under the
    interpreter in fp32 (_scaled_halves_f32), the same half of the same word."""
    pa, pb = tl.split(tl.reshape(p, (8, 4, REPS, 2, 4, SWP, 2)))
    if INTERPRET_DOT:
        la, ha = _scaled_halves_f32(pa, fw & 0xFFFF)
        lb, hb = _scaled_halves_f32(pb, (fw >> 16) & 0xFFFF)
    else:
        la, ha = _scaled_halves_bf16_half(pa, fw, 0)
        lb, hb = _scaled_halves_bf16_half(pb, fw, 1)
    return (tl.reshape(tl.join(la, lb), (8, 4, REPS, 2, 4, 2 * SWP)),
            tl.reshape(tl.join(ha, hb), (8, 4, REPS, 2, 4, 2 * SWP)))


@_device
def _mx_scaled_by_block(p, ev, od, REPS: tl.constexpr, INTERPRET_DOT: tl.constexpr):
    """Placed pairs p [8, 4, REPS, 2, 4 t, 4 q] times their MX block factors: word q = 2 j + i (block q) by half j of
    ev (i 0: blocks 0, 2) or od (i 1: blocks 1, 3), both [8, 4, REPS, 2, 4, 1] -> (lo, hi) as p."""
    pe, po = tl.split(tl.reshape(p, (8, 4, REPS, 2, 4, 2, 2)))
    le, he = _scaled_by_half_q(pe, ev, REPS, 1, INTERPRET_DOT)
    lo, ho = _scaled_by_half_q(po, od, REPS, 1, INTERPRET_DOT)
    return (tl.reshape(tl.join(le, lo), (8, 4, REPS, 2, 4, 4)), tl.reshape(tl.join(he, ho), (8, 4, REPS, 2, 4, 4)))


@_device
def _mul_bf16x2(x, c):
    """Packed bf16x2 product of the int32 words x and the constant word c (round to nearest, subnormals kept)."""
    return tl.inline_asm_elementwise("mul.rn.bf16x2 $0, $1, $2;", "=r,r,r", [x, (x & 0) | c],
                                     dtype=tl.int32, is_pure=True, pack=1)


@_device
def _in_order(b0, b1, b2, b3):
    """[..., 4]: b0, b1, b2, b3 along a new last dim (tl.join puts its operands on a new last dim, so the outer join
    takes the pairs (b0, b2) and (b1, b3))."""
    return tl.join(tl.join(b0, b2), tl.join(b1, b3))


@_device
def _dup_halves(x):
    """(low half in both halves, high half in both halves) of int32 words: two byte permutes."""
    return tl.inline_asm_elementwise("prmt.b32 $0, $2, $2, 0x1010; prmt.b32 $1, $2, $2, 0x3232;", "=r,=r,r", [x],
                                     dtype=(tl.int32, tl.int32), is_pure=True, pack=1)


@_device
def _scaled_halves_bf16(pair, f2):
    """The two bf16 values of a placed pair (value x 2^-126 each) times the block factor, f2 its bf16 bits in both
    halves, as one packed bf16x2 multiply (mul.rn keeps subnormals: the placed 0.5): MX by 2^(s - 1), NVFP4 by the
    E4M3 value x 2^119. Exact: every product is a bf16 value (NVFP4's x 2^-7 of the weight is the global scale's
    x 2^7)."""
    pair = tl.inline_asm_elementwise("mul.rn.bf16x2 $0, $1, $2;", "=r,r,r", [pair, f2], dtype=tl.int32, is_pure=True,
                                     pack=1)
    return tl.inline_asm_elementwise("mov.b32 {$0, $1}, $2;", "=h,=h,r", [pair], dtype=(tl.bfloat16, tl.bfloat16),
                                     is_pure=True, pack=1)


@_device
def _scaled_halves_f32(pair, fbits):
    """_scaled_halves_bf16's values in fp32 (the interpreter's twin)."""
    f = (fbits << 16).to(tl.float32, bitcast=True)
    lo = ((pair & 0xFFFF) << 16).to(tl.float32, bitcast=True)
    hi = ((pair >> 16) << 16).to(tl.float32, bitcast=True)
    return lo * f, hi * f


@_device
def _dot_weights_first(w, a, INTERPRET_DOT: tl.constexpr):
    """w [BN, BK] @ a.T [BK, BM]: the weights are the MMA's wide side (M), the tokens its N."""
    if INTERPRET_DOT:
        return tl.dot(w, tl.trans(a), input_precision="ieee")
    return tl.dot(w, tl.trans(a))


@_device
def _dot_scaled_tile(a, w_ptr, ws_ptr, expert, wrow, k0, n_mask, N_ROWS, K, PACKED: tl.constexpr,
                     BLOCK_K: tl.constexpr, DS_FMT: tl.constexpr):
    """a [BM, BK] (bf16 values) times the MX weight rows `wrow` over [k0, k0 + BK) via tl.dot_scaled:
    the weight tile goes in as codes [BK (/2 packed), BN] with its E8M0 scales [BN, BK / 32]."""
    e64 = expert.to(tl.int64)
    if PACKED:
        kk = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        kp = K // 2
    else:
        kk = k0 + tl.arange(0, BLOCK_K)
        kp = K
    # K need not be a multiple of BLOCK_K (gpt-oss: 2880): codes past K load as 0 with scale 1, and the
    # activation tile is 0 there
    w_t = tl.load(w_ptr + e64 * N_ROWS * kp + wrow[None, :].to(tl.int64) * kp + kk[:, None],
                  mask=n_mask[None, :] & (kk < kp)[:, None], other=0)
    sk = k0 // 32 + tl.arange(0, BLOCK_K // 32)
    sc = tl.load(ws_ptr + e64 * N_ROWS * (K // 32) + wrow[:, None].to(tl.int64) * (K // 32) + sk[None, :],
                 mask=n_mask[:, None] & (sk < K // 32)[None, :], other=127)
    # fast_math: no per-element NaN select for the scale 0xFF (1.30-1.36x on the H200, ../shared/PERF.md). The
    # scale then decodes as Inf: over zero codes (the NaN block quantizers write) 0 x Inf is still NaN, and
    # 0xFF over nonzero codes is declined in triton_dot_scaled.prepare(), as it was without fast_math.
    return tl.dot_scaled(a.to(tl.bfloat16), None, "bf16", w_t, sc, DS_FMT, fast_math=True)


@_device
def _dot(a, w, INTERPRET_DOT: tl.constexpr):
    if INTERPRET_DOT:
        return tl.dot(a, tl.trans(w), input_precision="ieee")
    return tl.dot(a.to(tl.bfloat16), tl.trans(w).to(tl.bfloat16))


@_device
def _tanh(x):
    # odd polynomial near 0 (no cancellation), (1 - e^-2|x|) / (1 + e^-2|x|) elsewhere
    ax = tl.abs(x)
    t = tl.exp(-2.0 * ax)
    big = (1.0 - t) / (1.0 + t)
    x2 = x * x
    small = ax * (1.0 + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0 + x2 * (-17.0 / 315.0))))
    r = tl.where(ax < 0.125, small, big)
    return tl.where(x < 0, -r, r)


@_device
def _gate(g, ACT: tl.constexpr, alpha, beta):
    # ACT: 0 SILU, 1 GELU, 2 GELU_TANH, 3 RELU2, 4 SWIGLUOAI, 5 SWIGLUSTEP, 6 SITU
    if ACT == 0 or ACT == 5:
        return g * tl.sigmoid(g)
    if ACT == 1:
        return 0.5 * g * (1.0 + tl.math.erf(g * 0.7071067811865476))
    if ACT == 2:
        return 0.5 * g * (1.0 + _tanh(0.7978845608028654 * (g + 0.044715 * g * g * g)))
    if ACT == 3:
        r = tl.maximum(g, 0.0)
        return r * r
    if ACT == 4:
        return g * tl.sigmoid(alpha * g)
    return beta * _tanh(g / beta) * tl.sigmoid(g)


@_device
def _activation(g, u, ACT: tl.constexpr, GATED: tl.constexpr, HAS_LIMIT: tl.constexpr, limit, alpha, beta,
                beta_lin):
    if not GATED:
        return _gate(g, ACT, alpha, beta)
    if HAS_LIMIT and ACT != 5:
        g = tl.minimum(g, limit)
        u = tl.minimum(tl.maximum(u, -limit), limit)
    if ACT == 4:
        return (u + 1.0) * _gate(g, ACT, alpha, beta)
    if ACT == 5:
        return tl.minimum(_gate(g, ACT, alpha, beta), limit) * tl.minimum(tl.maximum(u, -limit), limit)
    if ACT == 6:
        if beta_lin > 0:
            u = beta_lin * _tanh(u / beta_lin)
    return _gate(g, ACT, alpha, beta) * u


@_device
def _k_loop(a_ptr, a_scale_ptr, w_ptr, ws_ptr, w_block_scale_ptr, expert, a_row, m_mask, g_row, u_row, n_mask,
            N_ROWS, K, A_SCALE: tl.constexpr, W_KIND: tl.constexpr, PACKED: tl.constexpr, EBITS: tl.constexpr,
            MBITS: tl.constexpr, BIAS: tl.constexpr, W_BLOCK_SCALE: tl.constexpr, GATED: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, INTERPRET_DOT: tl.constexpr,
            DOT_SCALED: tl.constexpr, DS_FMT: tl.constexpr):
    """The K loop of every path but BITPLACE: gate and up accumulators [BLOCK_M, BLOCK_N]."""
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_offs = k0 + tl.arange(0, BLOCK_K)
        k_mask = k_offs < K
        a = tl.load(a_ptr + a_row[:, None] * K + k_offs[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        if INTERPRET_DOT or DOT_SCALED:  # compiled, the bf16 load goes straight into the MMA (exact either way)
            a = bf16_to_f32(a)
        if DOT_SCALED:
            pg = _dot_scaled_tile(a, w_ptr, ws_ptr, expert, g_row, k0, n_mask, N_ROWS, K, PACKED, BLOCK_K, DS_FMT)
            if GATED:
                pu = _dot_scaled_tile(a, w_ptr, ws_ptr, expert, u_row, k0, n_mask, N_ROWS, K, PACKED, BLOCK_K, DS_FMT)
            else:
                pu = pg
        else:
            wg = _weight_tile(w_ptr, ws_ptr, expert, g_row, k0, n_mask, N_ROWS, K, W_KIND, PACKED, EBITS,
                              MBITS, BIAS, BLOCK_N, BLOCK_K, not INTERPRET_DOT)
            pg = _dot(a, wg, INTERPRET_DOT)
            if GATED:
                wu = _weight_tile(w_ptr, ws_ptr, expert, u_row, k0, n_mask, N_ROWS, K, W_KIND, PACKED,
                                  EBITS, MBITS, BIAS, BLOCK_N, BLOCK_K, not INTERPRET_DOT)
                pu = _dot(a, wu, INTERPRET_DOT)
            else:
                pu = pg
        if A_SCALE == 2:
            sa = tl.load(a_scale_ptr + a_row * (K // 128) + k0 // 128, mask=m_mask, other=0.0)
            pg = pg * sa[:, None]
            pu = pu * sa[:, None]
        if W_BLOCK_SCALE:
            base = expert.to(tl.int64) * (N_ROWS // 128) * (K // 128) + k0 // 128
            swg = tl.load(w_block_scale_ptr + base + (g_row // 128) * (K // 128), mask=n_mask, other=0.0)
            swu = tl.load(w_block_scale_ptr + base + (u_row // 128) * (K // 128), mask=n_mask, other=0.0)
            pg = pg * swg[None, :]
            pu = pu * swu[None, :]
        acc_g += pg
        # ungated, pg added into acc_u too had two uses: compiled, each K step's MMA then started from zero and was
        # added in fp32, where _k_loop_tma's and every gated loop's MMAs chain on the accumulator (the matrix units'
        # truncating sums, harness.platforms' mma_truncation): GEMM2 differed by TMA or not at 0.2% of its bf16
        # outputs (results/gpu-issue28/run-16). One use: chained too, the same bits, and fp32 adds fewer.
        if GATED:
            acc_u += pu
    if not GATED:
        acc_u = acc_g
    return acc_g, acc_u


@_device
def _a_tile(a_desc, a_row0, a_row, m_mask, k0, K, A_TMA: tl.constexpr, BLOCK_K: tl.constexpr):
    """One K step of the activation rows: a TMA box of the block-gathered copy, or the block's rows gathered by
    pointers (masked: padding rows and K's tail read zeros, as the box's past the tensor)."""
    if A_TMA:  # one return for both (the compiler types the branches apart only as if / else)
        a = a_desc.load([a_row0, k0])
    else:
        k_offs = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_desc + a_row[:, None] * K + k_offs[None, :], mask=m_mask[:, None] & (k_offs < K)[None, :],
                    other=0.0)
    return a


@_device
def _k_loop_tma(a_desc, w_desc, expert, a_row0, a_row, m_mask, n0, N_OUT, N_ROWS, K, GATED: tl.constexpr,
                INTERLEAVED: tl.constexpr, A_TMA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, INTERPRET_DOT: tl.constexpr, WARP_SPEC: tl.constexpr = False):
    """_k_loop for bf16 weights by TMA: w_desc over the weights as [E x N_ROWS, K]; the activations by TMA too
    (A_TMA: a_desc over the block-gathered activation rows [blocks x BLOCK_M, K], the block's rows at a_row0) or by
    pointers (a_desc the activations' pointer, a_row and m_mask the block's rows); K's tail and rows past the tensor
    read as zeros (a tile's rows past N_OUT belong to the next rows or expert: their outputs are not stored). Gate and
    up rows interleaved (2n, 2n + 1): one [2 BLOCK_N, BLOCK_K] box and one MMA a step, the accumulator's even and odd
    columns split after the loop; each output element is the same K reduction of the same products as _k_loop's two
    MMAs.
    WARP_SPEC: 1 the K loop warp-specialized by Triton (sm90: a producer warpgroup issuing the TMA loads, two consumer
    warpgroups splitting the tile's rows); 2 the same descriptors and row pairs unspecialized (the bisect of a
    warp-specialized launch's wrong outputs). Its partitioning cannot split the one-box path's reshape of the
    accumulator, so interleaved gate and up rows are read as row pairs: w_desc over [E x N_OUT, 2 K] (row n: gate row
    n's K values, then up row n's), boxes [BLOCK_N, BLOCK_K] at columns k0 and K + k0 (K a multiple of BLOCK_K: no
    box straddles the two), two MMAs a step as for halves."""
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    wrow = expert * N_ROWS  # TMA coordinates are 32-bit (Kimi-K2's 384 x 4096 rows fit)
    if GATED and INTERLEAVED and WARP_SPEC:  # row pairs: gate row n at (n, k0), up row n at (n, K + k0)
        wrow = expert * N_OUT
        up_row = 0
        up_col = K
    else:  # halves: up row n at (N_OUT + n, k0)
        up_row = N_OUT
        up_col = 0
    if GATED and INTERLEAVED and not WARP_SPEC:
        acc = tl.zeros((BLOCK_M, 2 * BLOCK_N), dtype=tl.float32)
        for k0 in tl.range(0, K, BLOCK_K, warp_specialize=WARP_SPEC == 1):
            a = _a_tile(a_desc, a_row0, a_row, m_mask, k0, K, A_TMA, BLOCK_K)
            w = w_desc.load([wrow + 2 * n0, k0])
            if INTERPRET_DOT:
                a = bf16_to_f32(a)
                w = bf16_to_f32(w)
            acc += _dot(a, w, INTERPRET_DOT)
        acc_g, acc_u = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N, 2)))
    else:
        for k0 in tl.range(0, K, BLOCK_K, warp_specialize=WARP_SPEC == 1):
            a = _a_tile(a_desc, a_row0, a_row, m_mask, k0, K, A_TMA, BLOCK_K)
            wg = w_desc.load([wrow + n0, k0])
            if INTERPRET_DOT:
                a = bf16_to_f32(a)
                wg = bf16_to_f32(wg)
            acc_g += _dot(a, wg, INTERPRET_DOT)
            if GATED:
                wu = w_desc.load([wrow + up_row + n0, up_col + k0])
                if INTERPRET_DOT:
                    wu = bf16_to_f32(wu)
                acc_u += _dot(a, wu, INTERPRET_DOT)
        if not GATED:
            acc_u = acc_g
    return acc_g, acc_u


@triton.jit
def moe_gemm_kernel(
    a_ptr, a_scale_ptr, w_ptr, ws_ptr, w_block_scale_ptr, expert_scale_ptr, bias_ptr, out_ptr,
    sorted_rows_ptr, block_expert_ptr, n_pairs, a_row_div, N_OUT, N_ROWS, K, alpha, beta, beta_lin, limit, q_scale_ptr,
    A_SCALE: tl.constexpr, W_KIND: tl.constexpr, PACKED: tl.constexpr, EBITS: tl.constexpr, MBITS: tl.constexpr,
    BIAS: tl.constexpr, W_BLOCK_SCALE: tl.constexpr, HAS_EXPERT_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr,
    GATED: tl.constexpr, INTERLEAVED: tl.constexpr, ACT: tl.constexpr, APPLY_ACT: tl.constexpr,
    HAS_LIMIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    INTERPRET_DOT: tl.constexpr, DOT_SCALED: tl.constexpr = False, DS_FMT: tl.constexpr = "e2m1",
    BITPLACE: tl.constexpr = False, MMA_STEPS: tl.constexpr = 1, SPLIT_K: tl.constexpr = 1,
    ROW_PAIRS: tl.constexpr = False, QUANT_NVFP4: tl.constexpr = False, NV_NORMAL: tl.constexpr = False,
    GROUP_M: tl.constexpr = 0, A_TMA: tl.constexpr = False, W_TMA: tl.constexpr = False,
    PERSISTENT: tl.constexpr = False, used_blocks_ptr=None,
    SERIAL_K: tl.constexpr = False, count_ptr=None, final_ptr=None, WARP_SPEC: tl.constexpr = False, a_desc_rows=0,
    w_desc_rows=0, TAIL_M: tl.constexpr = 0, block_short_ptr=None, SCALE_REGS: tl.constexpr = False,
):
    """out[pair, n] for BLOCK_M pairs of one expert (rows of a: pair // a_row_div) x BLOCK_N outputs.

    A_SCALE: 0 none, 1 one fp32 scale, 2 one scale per a-row and 128 columns (FP8 1x128 dynamic).
    W_BLOCK_SCALE: FP8 128x128 weight scales [E, N_ROWS/128, K/128]. HAS_EXPERT_SCALE: one fp32 per
    expert (NVFP4 global decode scale, FP8 per-tensor weight scale). APPLY_ACT with GATED computes the
    gate and the up rows (halves, or interleaved) and stores act(bf16(gate), bf16(up)) rounded to bf16;
    otherwise stores bf16(acc). Rows of padding (pair id == n_pairs) are neither read nor written.
    SPLIT_K > 1 (BITPLACE only): program axis 2 takes 1 / SPLIT_K of the K chunks and out_ptr is an fp32
    workspace [SPLIT_K, pairs, 2, N_OUT] of partial sums for splitk_epilogue_kernel. QUANT_NVFP4: the epilogue
    stores the next GEMM's NVFP4 activation values (_epilogue). GROUP_M > 0: the grid's programs visit the tiles
    in groups of GROUP_M row blocks, N blocks the outer order within a group (grouped_tile_order); 0: row blocks
    fastest. Every tile is computed alike either way (the same bits); only which tiles run at once changes.
    A_TMA: a_ptr is a TMA descriptor over the activation rows gathered block by block (row pid_m x BLOCK_M + i is
    the block's pair i; gather_block_rows), boxes [BLOCK_M, the K step] (the bit-placement loop and W_TMA's);
    W_TMA (bf16 weights): w_ptr a descriptor over [E x N_ROWS, K], _k_loop_tma (the activations by A_TMA or by
    pointers).
    PERSISTENT: a grid of one dimension, each program computing the tiles program_id, + num_programs, ... of the
    used row blocks (their number at used_blocks_ptr, int32, read on the device: the blocks past them have expert -1)
    in the order the plain grid's programs would take them, as one loop that Triton flattens, so that the next
    tile's first loads are issued during this tile's last K steps and epilogue (no split-K). The same tiles, the same
    bits.
    TAIL_M (BLOCK_M = 2 TAIL_M): block pid_m is short where block_short_ptr[pid_m] is nonzero (an expert's last
    rows, at most TAIL_M of them, in the block's first TAIL_M slots): its tile is computed at TAIL_M rows, in the
    same launch as the expert's full blocks (its weights then still in L2), not at BLOCK_M rows of which half are
    padding.
    WARP_SPEC (A_TMA and W_TMA; _k_loop_tma): the K loop warp-specialized by Triton, a_ptr and w_ptr the tensors
    (the gathered activation rows, a_desc_rows of them; the weights, w_desc_rows rows of K, or of 2 K as gate and up
    row pairs where interleaved), their descriptors made here: Triton 3.9's sm90 warp specialization splits the boxes
    between its consumer warpgroups, which it cannot do to a descriptor made on the host.
    SERIAL_K (with SPLIT_K > 1): the split-K epilogue in this launch, not splitk_epilogue_kernel's: each program
    stores its partial sums, then counts itself in at count_ptr[tile] (int32, zero before the launch); the tile's
    last program adds the SPLIT_K partial sums in split order, as splitk_epilogue_kernel does, runs the same
    _epilogue into final_ptr (the same bits) and sets the count back to zero. One launch fewer at decode."""
    if PERSISTENT:  # the used blocks' tiles in turn, the next tile's first loads overlapping this one's last steps
        tl.static_assert(SPLIT_K == 1, "a persistent grid stores finished tiles, not split-K partial sums")
        tl.static_assert(not WARP_SPEC and not TAIL_M, "a persistent grid: no device descriptors, no short blocks")
        n_blocks_m = tl.load(used_blocks_ptr)
        n_blocks_n = tl.cdiv(N_OUT, BLOCK_N)
        for tile in tl.range(tl.program_id(0), n_blocks_m * n_blocks_n, tl.num_programs(0), flatten=True):
            pid_m = tile % n_blocks_m
            pid_n = tile // n_blocks_m
            if GROUP_M > 0:
                pid_m, pid_n = grouped_tile_order(pid_m, pid_n, n_blocks_m, n_blocks_n, GROUP_M)
            expert = tl.load(block_expert_ptr + pid_m)
            _moe_tile(a_ptr, a_scale_ptr, w_ptr, ws_ptr, w_block_scale_ptr, expert_scale_ptr, bias_ptr, out_ptr,
                      sorted_rows_ptr, n_pairs, a_row_div, N_OUT, N_ROWS, K, alpha, beta, beta_lin, limit,
                      q_scale_ptr, pid_m, pid_n, 0, expert, pid_m * BLOCK_M, A_SCALE, W_KIND, PACKED, EBITS, MBITS,
                      BIAS, W_BLOCK_SCALE, HAS_EXPERT_SCALE, HAS_BIAS, GATED, INTERLEAVED, ACT, APPLY_ACT, HAS_LIMIT,
                      BLOCK_M, BLOCK_N, BLOCK_K, INTERPRET_DOT, DOT_SCALED, DS_FMT, BITPLACE, MMA_STEPS, SPLIT_K,
                      ROW_PAIRS, QUANT_NVFP4, NV_NORMAL, A_TMA, W_TMA, SERIAL_K, count_ptr, final_ptr, WARP_SPEC,
                      SCALE_REGS)
    else:
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        if GROUP_M > 0:
            pid_m, pid_n = grouped_tile_order(pid_m, pid_n, tl.num_programs(0), tl.num_programs(1), GROUP_M)
        pid_s = tl.program_id(2)
        expert = tl.load(block_expert_ptr + pid_m)
        # a block past the used ones (the grid is sized for the worst case) computes nothing: an early return, or
        # with WARP_SPEC an if around the tile (Triton's sm90 warp specialization takes structured control flow only)
        if WARP_SPEC:
            used = expert >= 0
            a_ptr = tl.make_tensor_descriptor(a_ptr, shape=[a_desc_rows, K], strides=[K, 1],
                                              block_shape=[BLOCK_M, BLOCK_K])
            w_cols = 2 * K if GATED and INTERLEAVED else K
            w_ptr = tl.make_tensor_descriptor(w_ptr, shape=[w_desc_rows, w_cols], strides=[w_cols, 1],
                                              block_shape=[BLOCK_N, BLOCK_K])
        else:
            if expert < 0:
                return
            used: tl.constexpr = True
        if TAIL_M:  # a short block (an expert's last rows) at TAIL_M rows, the rest at BLOCK_M
            tl.static_assert(BLOCK_M == 2 * TAIL_M and not A_TMA and not WARP_SPEC,
                             "short blocks: BLOCK_M = 2 TAIL_M, activations by pointers, no warp specialization")
            if tl.load(block_short_ptr + pid_m) != 0:
                _moe_tile(a_ptr, a_scale_ptr, w_ptr, ws_ptr, w_block_scale_ptr, expert_scale_ptr, bias_ptr, out_ptr,
                          sorted_rows_ptr, n_pairs, a_row_div, N_OUT, N_ROWS, K, alpha, beta, beta_lin, limit,
                          q_scale_ptr, pid_m, pid_n, pid_s, expert, pid_m * BLOCK_M, A_SCALE, W_KIND, PACKED, EBITS,
                          MBITS, BIAS, W_BLOCK_SCALE, HAS_EXPERT_SCALE, HAS_BIAS, GATED, INTERLEAVED, ACT, APPLY_ACT,
                          HAS_LIMIT, TAIL_M, BLOCK_N, BLOCK_K, INTERPRET_DOT, DOT_SCALED, DS_FMT, BITPLACE, MMA_STEPS,
                          SPLIT_K, ROW_PAIRS, QUANT_NVFP4, NV_NORMAL, A_TMA, W_TMA, SERIAL_K, count_ptr, final_ptr,
                          WARP_SPEC, SCALE_REGS)
                return
        if used:
            _moe_tile(a_ptr, a_scale_ptr, w_ptr, ws_ptr, w_block_scale_ptr, expert_scale_ptr, bias_ptr, out_ptr,
                      sorted_rows_ptr, n_pairs, a_row_div, N_OUT, N_ROWS, K, alpha, beta, beta_lin, limit, q_scale_ptr,
                      pid_m, pid_n, pid_s, expert, pid_m * BLOCK_M, A_SCALE, W_KIND, PACKED, EBITS, MBITS, BIAS,
                      W_BLOCK_SCALE, HAS_EXPERT_SCALE, HAS_BIAS, GATED, INTERLEAVED, ACT, APPLY_ACT, HAS_LIMIT, BLOCK_M,
                      BLOCK_N, BLOCK_K, INTERPRET_DOT, DOT_SCALED, DS_FMT, BITPLACE, MMA_STEPS, SPLIT_K, ROW_PAIRS,
                      QUANT_NVFP4, NV_NORMAL, A_TMA, W_TMA, SERIAL_K, count_ptr, final_ptr, WARP_SPEC, SCALE_REGS)


@_device
def _moe_tile(a_ptr, a_scale_ptr, w_ptr, ws_ptr, w_block_scale_ptr, expert_scale_ptr, bias_ptr, out_ptr,
              sorted_rows_ptr, n_pairs, a_row_div, N_OUT, N_ROWS, K, alpha, beta, beta_lin, limit, q_scale_ptr,
              pid_m, pid_n, pid_s, expert, row0,
              A_SCALE: tl.constexpr, W_KIND: tl.constexpr, PACKED: tl.constexpr, EBITS: tl.constexpr,
              MBITS: tl.constexpr, BIAS: tl.constexpr, W_BLOCK_SCALE: tl.constexpr, HAS_EXPERT_SCALE: tl.constexpr,
              HAS_BIAS: tl.constexpr, GATED: tl.constexpr, INTERLEAVED: tl.constexpr, ACT: tl.constexpr,
              APPLY_ACT: tl.constexpr, HAS_LIMIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, INTERPRET_DOT: tl.constexpr, DOT_SCALED: tl.constexpr, DS_FMT: tl.constexpr,
              BITPLACE: tl.constexpr, MMA_STEPS: tl.constexpr, SPLIT_K: tl.constexpr, ROW_PAIRS: tl.constexpr,
              QUANT_NVFP4: tl.constexpr, NV_NORMAL: tl.constexpr, A_TMA: tl.constexpr, W_TMA: tl.constexpr,
              SERIAL_K: tl.constexpr, count_ptr, final_ptr, WARP_SPEC: tl.constexpr, SCALE_REGS: tl.constexpr):
    """moe_gemm_kernel's tile (pid_m, pid_n) of row block pid_m (its expert `expert`, at least 0; its rows the
    BLOCK_M slots of sorted_rows from row0), K range pid_s."""
    pair = tl.load(sorted_rows_ptr + row0 + tl.arange(0, BLOCK_M))
    m_mask = pair < n_pairs
    a_row = (pair // a_row_div).to(tl.int64)
    n_offs = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n_offs < N_OUT
    g_row, u_row = _gate_up_rows(n_offs, N_OUT, GATED, INTERLEAVED)
    tl.static_assert(SPLIT_K == 1 or BITPLACE, "split-K is the bit-placement loop's")
    if BITPLACE:  # FP4 weights by bit placement: weights x tokens^T, accumulators [BLOCK_N, BLOCK_M]
        tl.static_assert(A_SCALE != 2, "the bit-placement loop applies activation scales on the accumulator only")
        REPS: tl.constexpr = BLOCK_N // 64
        n0 = pid_n * BLOCK_N
        if GATED:
            if INTERLEAVED and not ROW_PAIRS:  # with ROW_PAIRS prepare() stored the gate rows, then the up rows
                G_MUL: tl.constexpr = 2
                g_add = 0
                u_add = 1
            else:
                G_MUL: tl.constexpr = 1
                g_add = 0
                u_add = N_OUT
        else:
            G_MUL: tl.constexpr = 1
            g_add = 0
            u_add = 0
        acc_gt = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        acc_ut = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        QW: tl.constexpr = 4 // MMA_STEPS  # words per thread-group and row in one MMA step
        chunks = (K + 127) // 128
        per_split = (chunks + SPLIT_K - 1) // SPLIT_K
        c_lo = pid_s * per_split
        c_hi = tl.minimum((pid_s + 1) * per_split, chunks)
        if SCALE_REGS:  # the block scales one K step ahead in registers, by loads the pipeliner leaves alone
            tl.static_assert(MMA_STEPS == 1, "SCALE_REGS: one MMA step a chunk")
            c_first = tl.minimum(c_lo, chunks - 1)  # an empty split reads a valid chunk it never uses
            sg = _fp4_scale_words(ws_ptr, expert, n0, G_MUL, g_add, N_OUT, c_first, N_ROWS, K, W_KIND, REPS, QW, 0,
                                  ROW_PAIRS, not INTERPRET_DOT)
            su = sg
            if GATED:
                su = _fp4_scale_words(ws_ptr, expert, n0, G_MUL, u_add, N_OUT, c_first, N_ROWS, K, W_KIND, REPS, QW,
                                      0, ROW_PAIRS, not INTERPRET_DOT)
        for ci in range(c_lo, c_hi):  # offsets ci x 16 words
            for qh in tl.static_range(MMA_STEPS):
                k_offs = ci * 128 + qh * 32 * QW + tl.arange(0, 32 * QW)
                # bf16 straight into the dot when compiled (a load the pipeliner streams into shared memory)
                if A_TMA:
                    a = a_ptr.load([row0, ci * 128 + qh * 32 * QW])
                else:
                    a = tl.load(a_ptr + a_row[:, None] * K + k_offs[None, :],
                                mask=m_mask[:, None] & (k_offs < K)[None, :], other=0.0)
                if INTERPRET_DOT:
                    a = bf16_to_f32(a)
                if SCALE_REGS:
                    c_next = tl.minimum(ci + 1, c_hi - 1)  # the last step reads its own chunk's again
                    sg_next = _fp4_scale_words(ws_ptr, expert, n0, G_MUL, g_add, N_OUT, c_next, N_ROWS, K, W_KIND,
                                               REPS, QW, 0, ROW_PAIRS, not INTERPRET_DOT)
                    wg = _fp4_bitplace_decode(w_ptr, sg, expert, n0, G_MUL, g_add, N_OUT, ci, N_ROWS, K, W_KIND,
                                              REPS, INTERPRET_DOT, QW, qh, ROW_PAIRS, NV_NORMAL)
                    sg = sg_next
                else:
                    wg = _fp4_bitplace_tile(w_ptr, ws_ptr, expert, n0, G_MUL, g_add, N_OUT, ci, N_ROWS, K, W_KIND,
                                            REPS, INTERPRET_DOT, QW, qh, ROW_PAIRS, NV_NORMAL)
                acc_gt += _dot_weights_first(wg, a, INTERPRET_DOT)
                if GATED:
                    if SCALE_REGS:
                        su_next = _fp4_scale_words(ws_ptr, expert, n0, G_MUL, u_add, N_OUT, c_next, N_ROWS, K,
                                                   W_KIND, REPS, QW, 0, ROW_PAIRS, not INTERPRET_DOT)
                        wu = _fp4_bitplace_decode(w_ptr, su, expert, n0, G_MUL, u_add, N_OUT, ci, N_ROWS, K, W_KIND,
                                                  REPS, INTERPRET_DOT, QW, qh, ROW_PAIRS, NV_NORMAL)
                        su = su_next
                    else:
                        wu = _fp4_bitplace_tile(w_ptr, ws_ptr, expert, n0, G_MUL, u_add, N_OUT, ci, N_ROWS, K,
                                                W_KIND, REPS, INTERPRET_DOT, QW, qh, ROW_PAIRS, NV_NORMAL)
                    acc_ut += _dot_weights_first(wu, a, INTERPRET_DOT)
        acc_g = tl.trans(acc_gt)
        acc_u = tl.trans(acc_ut) if GATED else acc_g
    elif W_TMA:
        tl.static_assert(W_KIND == 0 and A_SCALE != 2 and not W_BLOCK_SCALE and not DOT_SCALED,
                         "TMA weights: bf16, no per-step scales")
        acc_g, acc_u = _k_loop_tma(a_ptr, w_ptr, expert, row0, a_row, m_mask, pid_n * BLOCK_N, N_OUT,
                                   N_ROWS, K, GATED, INTERLEAVED, A_TMA, BLOCK_M, BLOCK_N, BLOCK_K, INTERPRET_DOT,
                                   WARP_SPEC)
    else:
        tl.static_assert(not A_TMA, "the dequantizing loop gathers its activation rows itself")
        acc_g, acc_u = _k_loop(a_ptr, a_scale_ptr, w_ptr, ws_ptr, w_block_scale_ptr, expert, a_row, m_mask, g_row,
                               u_row, n_mask, N_ROWS, K, A_SCALE, W_KIND, PACKED, EBITS, MBITS, BIAS, W_BLOCK_SCALE,
                               GATED, BLOCK_M, BLOCK_N, BLOCK_K, INTERPRET_DOT, DOT_SCALED, DS_FMT)
    if SPLIT_K > 1:  # fp32 partial sums of this K range; splitk_epilogue_kernel adds them in order
        part = ((pid_s * n_pairs + pair.to(tl.int64))[:, None] * 2) * N_OUT + n_offs[None, :]
        tl.store(out_ptr + part, acc_g, mask=m_mask[:, None] & n_mask[None, :])
        if GATED:
            tl.store(out_ptr + part + N_OUT, acc_u, mask=m_mask[:, None] & n_mask[None, :])
        if SERIAL_K:
            _serial_splitk_epilogue(out_ptr, count_ptr, final_ptr, pid_m, pid_n, pair, m_mask, n_offs, n_mask, g_row,
                                    u_row, expert, n_pairs, a_scale_ptr, expert_scale_ptr, bias_ptr, N_OUT, N_ROWS,
                                    alpha, beta, beta_lin, limit, q_scale_ptr, A_SCALE, HAS_EXPERT_SCALE, HAS_BIAS,
                                    GATED, ACT, APPLY_ACT, HAS_LIMIT, QUANT_NVFP4, SPLIT_K, BLOCK_M, BLOCK_N)
    else:
        _epilogue(acc_g, acc_u, pair, m_mask, n_offs, n_mask, g_row, u_row, expert, a_scale_ptr, expert_scale_ptr,
                  bias_ptr, out_ptr, N_OUT, N_ROWS, alpha, beta, beta_lin, limit, A_SCALE, HAS_EXPERT_SCALE, HAS_BIAS,
                  GATED, ACT, APPLY_ACT, HAS_LIMIT, q_scale_ptr, QUANT_NVFP4, BLOCK_M, BLOCK_N)




@_device
def add_split_partials(part_ptr, acc_g, acc_u, pair, m_mask, n_offs, n_mask, n_pairs, N_OUT, GATED: tl.constexpr,
                       SPLIT_K: tl.constexpr, CACHE: tl.constexpr):
    """acc_g, acc_u (zeros, in the caller's shape and layout) plus the split-K partial sums [SPLIT_K, pairs, 2,
    N_OUT] (fp32; gate, up) of pairs x n, in split order (deterministic; 0 + p0 + p1 ..., the sums every split-K
    epilogue makes); acc_u is acc_g when not GATED. CACHE: the loads' cache modifier (".cg": past L1, for partial
    sums other programs of the same launch stored)."""
    mask = m_mask[:, None] & n_mask[None, :]
    for s in tl.static_range(SPLIT_K):
        part = ((s * n_pairs + pair.to(tl.int64))[:, None] * 2) * N_OUT + n_offs[None, :]
        acc_g += tl.load(part_ptr + part, mask=mask, other=0.0, cache_modifier=CACHE)
        if GATED:
            acc_u += tl.load(part_ptr + part + N_OUT, mask=mask, other=0.0, cache_modifier=CACHE)
    if not GATED:
        acc_u = acc_g
    return acc_g, acc_u


@_device
def _serial_splitk_epilogue(part_ptr, count_ptr, out_ptr, pid_m, pid_n, pair, m_mask, n_offs, n_mask, g_row, u_row,
                            expert, n_pairs, a_scale_ptr, expert_scale_ptr, bias_ptr, N_OUT, N_ROWS, alpha, beta,
                            beta_lin, limit, q_scale_ptr, A_SCALE: tl.constexpr, HAS_EXPERT_SCALE: tl.constexpr,
                            HAS_BIAS: tl.constexpr, GATED: tl.constexpr, ACT: tl.constexpr, APPLY_ACT: tl.constexpr,
                            HAS_LIMIT: tl.constexpr, QUANT_NVFP4: tl.constexpr, SPLIT_K: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """moe_gemm_kernel's SERIAL_K: after this program's partial sums of tile (pid_m, pid_n) are stored, count it in;
    the tile's last program finishes it as splitk_epilogue_kernel would: the partial sums [SPLIT_K, pairs, 2, N_OUT]
    added in split order from zero, then _epilogue, into out_ptr; then the count is set back to zero."""
    # every thread's stores before the one count a program (its release makes them visible to the program that
    # counts last, whose acquire orders its loads after the other programs' stores; the loads skip L1: .cg)
    tl.debug_barrier()
    tile = pid_m * tl.cdiv(N_OUT, BLOCK_N) + pid_n
    arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
    if arrived == SPLIT_K - 1:
        acc_g, acc_u = add_split_partials(part_ptr, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32),
                                          tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), pair, m_mask, n_offs,
                                          n_mask, n_pairs, N_OUT, GATED, SPLIT_K, ".cg")
        _epilogue(acc_g, acc_u, pair, m_mask, n_offs, n_mask, g_row, u_row, expert, a_scale_ptr, expert_scale_ptr,
                  bias_ptr, out_ptr, N_OUT, N_ROWS, alpha, beta, beta_lin, limit, A_SCALE, HAS_EXPERT_SCALE, HAS_BIAS,
                  GATED, ACT, APPLY_ACT, HAS_LIMIT, q_scale_ptr, QUANT_NVFP4, BLOCK_M, BLOCK_N)
        tl.atomic_xchg(count_ptr + tile, 0)  # ready for the next launch


@_device
def grouped_tile_order(pid_m, pid_n, n_blocks_m, n_blocks_n, GROUP_M: tl.constexpr):
    """The (row block, N block) that launch slot (pid_m, pid_n) computes when slots run row blocks fastest:
    GROUP_M row blocks at a time, each of their N blocks in turn, so that the programs resident together share
    the group's gathered activation rows and its experts' weight columns through L2 (at 8192 tokens the plain
    order streams every activation row from memory once per N block: 16-112 times). A bijection of the grid."""
    slot = pid_n * n_blocks_m + pid_m
    per_group = GROUP_M * n_blocks_n
    first_m = (slot // per_group) * GROUP_M
    rows_here = tl.minimum(n_blocks_m - first_m, GROUP_M)
    within = slot % per_group
    return first_m + within % rows_here, within // rows_here


@_device
def _gate_up_rows(n_offs, N_OUT, GATED: tl.constexpr, INTERLEAVED: tl.constexpr):
    """The weight rows of outputs n: gate and up (halves, or interleaved), or n itself."""
    if GATED:
        if INTERLEAVED:
            return 2 * n_offs, 2 * n_offs + 1
        return n_offs, n_offs + N_OUT
    return n_offs, n_offs


@_device
def _epilogue(acc_g, acc_u, pair, m_mask, n_offs, n_mask, g_row, u_row, expert, a_scale_ptr, expert_scale_ptr,
              bias_ptr, out_ptr, N_OUT, N_ROWS, alpha, beta, beta_lin, limit, A_SCALE: tl.constexpr,
              HAS_EXPERT_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr, GATED: tl.constexpr, ACT: tl.constexpr,
              APPLY_ACT: tl.constexpr, HAS_LIMIT: tl.constexpr, q_scale_ptr, QUANT_NVFP4: tl.constexpr,
              ROWS: tl.constexpr, COLS: tl.constexpr):
    """Scales, bias, the bf16 rounding points and the activation of fp32 sums [ROWS pairs, COLS n], stored as bf16.
    `expert` is the block's (a scalar) or each pair's ([pairs, 1], split-K). QUANT_NVFP4 (GEMM1 of NVFP4 W4A4): what
    is stored is the next GEMM's NVFP4 activation values (tensor scale q_scale_ptr), nvfp4_quantize_kernel's
    launch folded in: the same values from the same fp32 operations (COLS whole 16-column blocks)."""
    if A_SCALE == 1:
        sa1 = tl.load(a_scale_ptr)
        acc_g = acc_g * sa1
        acc_u = acc_u * sa1
    if HAS_EXPERT_SCALE:
        se = tl.load(expert_scale_ptr + expert)
        acc_g = acc_g * se
        acc_u = acc_u * se
    if HAS_BIAS:
        brow = expert.to(tl.int64) * N_ROWS
        acc_g = acc_g + tl.load(bias_ptr + brow + g_row[None, :], mask=n_mask[None, :], other=0.0)
        if GATED:
            acc_u = acc_u + tl.load(bias_ptr + brow + u_row[None, :], mask=n_mask[None, :], other=0.0)
    h_g = round_bf16(acc_g)  # the gemm1_out / gemm2_out rounding point
    if APPLY_ACT:
        h_u = round_bf16(acc_u)
        y = round_bf16(_activation(h_g, h_u, ACT, GATED, HAS_LIMIT, limit, alpha, beta, beta_lin))  # act_out
    else:
        y = h_g
    if QUANT_NVFP4:
        tl.static_assert(COLS % 16 == 0, "whole 16-column NVFP4 blocks per program")
        # columns past N_OUT are zero, as nvfp4_quantize_kernel's masked loads are (N_OUT is whole blocks anyway)
        y3 = tl.reshape(tl.where(n_mask[None, :], y, 0.0), (ROWS, COLS // 16, 16))
        v = _nvfp4_block_values(y3, tl.load(q_scale_ptr), 2)
        y = tl.reshape(v, (ROWS, COLS))
    out_offs = pair.to(tl.int64)[:, None] * N_OUT + n_offs[None, :]
    tl.store(out_ptr + out_offs, f32_to_bf16(y), mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def splitk_epilogue_kernel(part_ptr, ids_ptr, a_scale_ptr, expert_scale_ptr, bias_ptr, out_ptr, n_pairs, N_OUT,
                           N_ROWS, alpha, beta, beta_lin, limit, SPLIT_K: tl.constexpr, A_SCALE: tl.constexpr,
                           HAS_EXPERT_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr, GATED: tl.constexpr,
                           INTERLEAVED: tl.constexpr, ACT: tl.constexpr, APPLY_ACT: tl.constexpr,
                           HAS_LIMIT: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, q_scale_ptr,
                           QUANT_NVFP4: tl.constexpr, PDL: tl.constexpr = False):
    """The split-K GEMM's sums: partials [SPLIT_K, pairs, 2, N_OUT] (fp32) added in split order, then the GEMM
    epilogue of moe_gemm_kernel (each pair's expert from ids_ptr, the flat top-k ids). QUANT_NVFP4 (GEMM1 of NVFP4
    W4A4): the outputs stored are the next GEMM's NVFP4 activation values (tensor scale q_scale_ptr), the launch
    of nvfp4_quantize_kernel folded in: the same values, from the same fp32 operations.
    PDL (launched as a programmatic dependent, PDL_ORDER): the next kernel may start at once (GEMM2 prefetching its
    weights while GEMM1 ends), then this one waits for GEMM1's partials."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    pair = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    m_mask = pair < n_pairs
    n_offs = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n_offs < N_OUT
    acc_g, acc_u = add_split_partials(part_ptr, tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32),
                                      tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32), pair, m_mask, n_offs, n_mask,
                                      n_pairs, N_OUT, GATED, SPLIT_K, "")
    expert = tl.load(ids_ptr + pair, mask=m_mask, other=0).to(tl.int32)[:, None]
    g_row, u_row = _gate_up_rows(n_offs, N_OUT, GATED, INTERLEAVED)
    _epilogue(acc_g, acc_u, pair, m_mask, n_offs, n_mask, g_row, u_row, expert, a_scale_ptr, expert_scale_ptr,
              bias_ptr, out_ptr, N_OUT, N_ROWS, alpha, beta, beta_lin, limit, A_SCALE, HAS_EXPERT_SCALE, HAS_BIAS,
              GATED, ACT, APPLY_ACT, HAS_LIMIT, q_scale_ptr, QUANT_NVFP4, BLOCK_P, BLOCK_N)


@triton.jit
def moe_align_kernel(ids_ptr, start_ptr, sorted_rows_ptr, block_expert_ptr, n_pairs, max_blocks,
                     BLOCK_M: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_E: tl.constexpr, CHUNK: tl.constexpr,
                     x_ptr=None, values_ptr=None, s_dec_ptr=None, x_rows=0, x_cols=16,
                     QUANT_NVFP4: tl.constexpr = False, PDL: tl.constexpr = False, FILL: tl.constexpr = 16,
                     OWNER_BY_EXPERT: tl.constexpr = False, RANK_SORT: tl.constexpr = False):
    """The routing glue of the fused MoE in one program, for at most BLOCK_P pairs (decode): pairs (token, k) in
    expert order, stable, each expert's run padded to whole blocks of BLOCK_M with the sentinel n_pairs
    (sorted_rows, max_blocks x BLOCK_M), and the expert of each block, -1 past the used ones (block_expert).
    The same two arrays as the dozen torch ops of TritonEmulationBackend._align_torch, in one launch.
    start_ptr: BLOCK_E int32 of scratch (per expert: its first block, or its first slot less its first rank).
    FILL: sentinel slots a store. OWNER_BY_EXPERT: each expert's id stored into its blocks by all experts at once,
    one block of each a step (_expert_blocks: as many steps as the most blocks an expert has, one or two at decode),
    -1 past them FILL a store; else each block's expert counted as the experts whose blocks end at or before it
    (CHUNK x BLOCK_E compares a step).
    RANK_SORT: the pairs sorted by (expert, pair) in registers, the j-th at slot j + its expert's first block x
    BLOCK_M - the pairs of earlier experts; else each pair's rank as the earlier pairs of its expert, CHUNK a step.
    QUANT_NVFP4: programs 1.. (16 rows x 16 columns each) also store GEMM1's NVFP4 activation values of x
    (nvfp4_quantize_kernel's, the same _nvfp4_tile): one launch fewer at decode (issue 28, W4A4).
    PDL: GEMM1, a programmatic dependent (PDL_ORDER), may launch at once and wait there for these arrays."""
    if PDL:
        gdc_launch_dependents()
    if QUANT_NVFP4:
        tile = tl.program_id(0) - 1
        if tile >= 0:
            n_b = x_cols // 16
            _, mask, offs, _, _, v = _nvfp4_tile(x_ptr, s_dec_ptr, x_rows, x_cols, 16, tile // n_b, tile % n_b)
            tl.store(values_ptr + offs, f32_to_bf16(v), mask=mask)
            return
    p = tl.arange(0, BLOCK_P)
    pmask = p < n_pairs
    ids = tl.load(ids_ptr + p, mask=pmask, other=0).to(tl.int32)
    counts = tl.histogram(ids, BLOCK_E, mask=pmask)
    blocks = (counts + BLOCK_M - 1) // BLOCK_M
    block_end = tl.cumsum(blocks, 0)
    total = tl.sum(blocks, 0)
    e = tl.arange(0, BLOCK_E)
    if RANK_SORT:
        tl.store(start_ptr + e, (block_end - blocks) * BLOCK_M - (tl.cumsum(counts, 0) - counts))
    else:
        tl.store(start_ptr + e, block_end - blocks)
    for s0 in range(0, max_blocks * BLOCK_M, FILL):
        s = s0 + tl.arange(0, FILL)
        tl.store(sorted_rows_ptr + s, tl.zeros((FILL,), tl.int32) + n_pairs, mask=s < max_blocks * BLOCK_M)
    if OWNER_BY_EXPERT:
        _expert_blocks(block_expert_ptr, block_expert_ptr, block_end - blocks, blocks, counts, BLOCK_E, max_blocks,
                       BLOCK_M, BLOCK_M, False, BLOCK_E, FILL)
    else:
        # block b belongs to the number of experts whose blocks end at or before it
        for b0 in range(0, max_blocks, CHUNK):
            b = b0 + tl.arange(0, CHUNK)
            owner = tl.sum((block_end[None, :] <= b[:, None]).to(tl.int32), 1)
            tl.store(block_expert_ptr + b, tl.where(b < total, owner, -1), mask=b < max_blocks)
    tl.debug_barrier()  # the sentinels and the scratch before the pairs' slots (one program)
    if RANK_SORT:
        # keys (expert, pair) are distinct and a pair's position in their order is its slot less its expert's
        # offset: stable within an expert; the lanes past n_pairs sort last and store nothing
        key = tl.sort(tl.where(pmask, ids, BLOCK_E) * BLOCK_P + p)
        expert = key // BLOCK_P
        valid = expert < BLOCK_E
        offset = tl.load(start_ptr + expert, mask=valid, other=0)
        tl.store(sorted_rows_ptr + offset + p, key % BLOCK_P, mask=valid)
    else:
        # a pair's slot: its expert's first block x BLOCK_M + the number of earlier pairs of that expert
        rank = tl.zeros((BLOCK_P,), tl.int32)
        for q0 in range(0, BLOCK_P, CHUNK):
            q = q0 + tl.arange(0, CHUNK)
            idq = tl.load(ids_ptr + q, mask=q < n_pairs, other=-1).to(tl.int32)
            rank += tl.sum(((idq[None, :] == ids[:, None]) & (q[None, :] < p[:, None])).to(tl.int32), 1)
        first = tl.load(start_ptr + ids, mask=pmask, other=0)
        tl.store(sorted_rows_ptr + first * BLOCK_M + rank, p, mask=pmask)


@triton.jit
def align_count_kernel(ids_ptr, chunk_counts_ptr, n_pairs, BLOCK_E: tl.constexpr, CHUNK: tl.constexpr):
    """The routing glue at any number of pairs (prefill), step 1 of 3: the pairs of expert e in chunk c (CHUNK
    pairs a program) into chunk_counts[c, e] (BLOCK_E columns)."""
    c = tl.program_id(0)
    p = c * CHUNK + tl.arange(0, CHUNK)
    ids = tl.load(ids_ptr + p, mask=p < n_pairs, other=0).to(tl.int32)
    tl.store(chunk_counts_ptr + c * BLOCK_E + tl.arange(0, BLOCK_E), tl.histogram(ids, BLOCK_E, mask=p < n_pairs))


@triton.jit
def align_layout_kernel(chunk_counts_ptr, chunk_base_ptr, expert_ptr, rows_big_ptr, experts_big_ptr, rows_tail_ptr,
                        experts_tail_ptr, short_ptr, n_chunks, n_pairs, num_experts, big_blocks, tail_blocks,
                        BLOCK_M: tl.constexpr, TAIL_M: tl.constexpr, MODE: tl.constexpr, BLOCK_E: tl.constexpr,
                        FILL: tl.constexpr, SCAN: tl.constexpr):
    """Step 2 of 3, one program: each chunk's first rank of each expert (chunk_base[c, e]: the pairs of e in the
    chunks before c), the blocks' layout and every slot's sentinel n_pairs. An expert of n pairs gets, experts in
    order, MODE 0 (plain) and 2 (inline_tails): ceil(n / BLOCK_M) blocks of BLOCK_M rows; MODE 1 (tail_m): of its
    s = ceil(n / TAIL_M) small blocks, s // (BLOCK_M / TAIL_M) blocks of BLOCK_M rows in the first array and the
    s % (BLOCK_M / TAIL_M) left in the second, TAIL_M rows each. experts_*: each block's expert, -1 past the used;
    short (MODE 2): 1 for a block of at most TAIL_M pairs (an expert's last, computed at TAIL_M rows).
    expert_ptr: scratch [3, BLOCK_E] (each expert's first big block, big blocks, first tail block). FILL slots a
    step; SCAN chunks a step of the scan."""
    e = tl.arange(0, BLOCK_E)
    running = tl.zeros((BLOCK_E,), tl.int32)
    for c0 in range(0, n_chunks, SCAN):  # SCAN chunks a step: a few dependent loads, not one a chunk
        c = c0 + tl.arange(0, SCAN)
        offs = c[:, None] * BLOCK_E + e[None, :]
        counts = tl.load(chunk_counts_ptr + offs, mask=(c < n_chunks)[:, None], other=0)
        tl.store(chunk_base_ptr + offs, running[None, :] + tl.cumsum(counts, 0) - counts, mask=(c < n_chunks)[:, None])
        running += tl.sum(counts, 0)
    RATIO: tl.constexpr = BLOCK_M // TAIL_M
    if MODE == 1:
        small = (running + TAIL_M - 1) // TAIL_M
        big = small // RATIO
        tail = small % RATIO
    else:
        big = (running + BLOCK_M - 1) // BLOCK_M
        tail = tl.zeros((BLOCK_E,), tl.int32)
    big_end = tl.cumsum(big, 0)
    tail_end = tl.cumsum(tail, 0)
    tl.store(expert_ptr + e, big_end - big)
    tl.store(expert_ptr + BLOCK_E + e, big)
    tl.store(expert_ptr + 2 * BLOCK_E + e, tail_end - tail)
    _expert_blocks(experts_big_ptr, short_ptr, big_end - big, big, running, num_experts, big_blocks, BLOCK_M,
                   TAIL_M, MODE == 2, BLOCK_E, FILL)
    for s0 in range(0, big_blocks * BLOCK_M, FILL):
        s = s0 + tl.arange(0, FILL)
        tl.store(rows_big_ptr + s, tl.zeros((FILL,), tl.int32) + n_pairs, mask=s < big_blocks * BLOCK_M)
    if MODE == 1:
        _expert_blocks(experts_tail_ptr, short_ptr, tail_end - tail, tail, running, num_experts, tail_blocks, TAIL_M,
                       TAIL_M, False, BLOCK_E, FILL)
        for s0 in range(0, tail_blocks * TAIL_M, FILL):
            s = s0 + tl.arange(0, FILL)
            tl.store(rows_tail_ptr + s, tl.zeros((FILL,), tl.int32) + n_pairs, mask=s < tail_blocks * TAIL_M)


@_device
def _expert_blocks(experts_ptr, short_ptr, first, blocks, pairs, num_experts, n_blocks, ROWS: tl.constexpr,
                   TAIL_M: tl.constexpr, SHORT: tl.constexpr, BLOCK_E: tl.constexpr, FILL: tl.constexpr):
    """align_layout_kernel's block experts: expert e's blocks first[e] .. first[e] + blocks[e] - 1 hold e, written by
    all experts at once, one block of each a step (as many steps as the most blocks an expert has); the blocks past
    the used ones -1 (disjoint slots: no ordering between the program's threads needed). SHORT: short_ptr's flag of
    each block, 1 where it holds at most TAIL_M of its expert's pairs (ROWS a block)."""
    e = tl.arange(0, BLOCK_E)
    has = e < num_experts
    for j in range(0, tl.max(tl.where(has, blocks, 0), 0)):
        mine = has & (j < blocks)
        tl.store(experts_ptr + first + j, e, mask=mine)
        if SHORT:
            tl.store(short_ptr + first + j, (pairs - j * ROWS <= TAIL_M).to(tl.int32), mask=mine)
    used = tl.sum(tl.where(has, blocks, 0), 0)
    for b0 in range(0, n_blocks, FILL):
        b = b0 + tl.arange(0, FILL)
        tl.store(experts_ptr + b, tl.zeros((FILL,), tl.int32) - 1, mask=(b >= used) & (b < n_blocks))
        if SHORT:
            tl.store(short_ptr + b, tl.zeros((FILL,), tl.int32), mask=(b >= used) & (b < n_blocks))


@triton.jit
def align_scatter_kernel(ids_ptr, chunk_base_ptr, expert_ptr, rows_big_ptr, rows_tail_ptr, n_pairs,
                         BLOCK_M: tl.constexpr, TAIL_M: tl.constexpr, MODE: tl.constexpr, BLOCK_E: tl.constexpr,
                         CHUNK: tl.constexpr, STEP: tl.constexpr):
    """Step 3 of 3: each pair's slot. Its rank r among its expert's pairs (stable: the pairs of the expert in earlier
    chunks, chunk_base, plus those before it in its chunk) puts it at slot r of its expert's first block; MODE 1:
    past the expert's big blocks, at slot r - big x BLOCK_M of its first tail block."""
    c = tl.program_id(0)
    p = c * CHUNK + tl.arange(0, CHUNK)
    pmask = p < n_pairs
    ids = tl.load(ids_ptr + p, mask=pmask, other=0).to(tl.int32)
    rank = tl.load(chunk_base_ptr + c * BLOCK_E + ids, mask=pmask, other=0)
    for q0 in range(0, CHUNK, STEP):
        q = c * CHUNK + q0 + tl.arange(0, STEP)
        idq = tl.load(ids_ptr + q, mask=q < n_pairs, other=-1).to(tl.int32)
        rank += tl.sum(((idq[None, :] == ids[:, None]) & (q[None, :] < p[:, None])).to(tl.int32), 1)
    first = tl.load(expert_ptr + ids, mask=pmask, other=0)
    if MODE == 1:
        big_rows = tl.load(expert_ptr + BLOCK_E + ids, mask=pmask, other=0) * BLOCK_M
        in_big = rank < big_rows
        tl.store(rows_big_ptr + first * BLOCK_M + rank, p, mask=pmask & in_big)
        tail_first = tl.load(expert_ptr + 2 * BLOCK_E + ids, mask=pmask, other=0)
        tl.store(rows_tail_ptr + tail_first * TAIL_M + rank - big_rows, p, mask=pmask & (rank >= big_rows))
    else:
        tl.store(rows_big_ptr + first * BLOCK_M + rank, p, mask=pmask)


@triton.jit
def splitk_topk_reduce_kernel(part_ptr, ids_ptr, w_ptr, a_scale_ptr, expert_scale_ptr, bias_ptr, out_ptr, n_pairs, H,
                              N_ROWS, SPLIT_K: tl.constexpr, TOP_K: tl.constexpr, A_SCALE: tl.constexpr,
                              HAS_EXPERT_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_H: tl.constexpr,
                              PDL: tl.constexpr = False):
    """GEMM2's split-K sums, its epilogue and the top-k sum in one launch (decode, where a launch costs a few us
    beside GEMMs of tens): per token, per pair j in order, the partials [SPLIT_K, pairs, 2, H] added in split order,
    scaled, biased and rounded to bf16 (gemm2_out), then weighted and summed in fp32 and rounded once. The same
    operations in the same order as splitk_epilogue_kernel followed by topk_reduce_kernel: bit for bit theirs.
    PDL (a programmatic dependent, PDL_ORDER): waits for GEMM2's partials before anything else."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = h < H
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for j in range(TOP_K):
        pair = t * TOP_K + j
        z = tl.zeros((BLOCK_H,), dtype=tl.float32)
        for s in range(SPLIT_K):  # in order: deterministic
            z += tl.load(part_ptr + ((s * n_pairs + pair) * 2) * H + h, mask=mask, other=0.0)
        expert = tl.load(ids_ptr + pair).to(tl.int32)
        if A_SCALE == 1:
            z = z * tl.load(a_scale_ptr)
        if HAS_EXPERT_SCALE:
            z = z * tl.load(expert_scale_ptr + expert)
        if HAS_BIAS:
            z = z + tl.load(bias_ptr + expert.to(tl.int64) * N_ROWS + h, mask=mask, other=0.0)
        wj = tl.load(w_ptr + pair)
        acc += wj * round_bf16(z)
    tl.store(out_ptr + t * H + h, f32_to_bf16(round_bf16(acc)), mask=mask)


@triton.jit
def topk_reduce_kernel(z_ptr, w_ptr, out_ptr, H, TOP_K: tl.constexpr, BLOCK_H: tl.constexpr):
    """out[t] = bf16(sum_j w[t, j] * z[t * TOP_K + j]) in fp32, j in order: deterministic, no atomics."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = h < H
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for j in range(TOP_K):
        wj = tl.load(w_ptr + t * TOP_K + j)
        zj = bf16_to_f32(tl.load(z_ptr + (t * TOP_K + j) * H + h, mask=mask, other=0.0))
        acc += wj * zj
    tl.store(out_ptr + t * H + h, f32_to_bf16(round_bf16(acc)), mask=mask)


# The warp-specialised Gluon GEMMs (issue 28; harness/backends/gluon_kernels.py), attributes here so that their
# launches are K.<kernel>[grid] like every other (compile_check records them by that name).
from .gluon_kernels import bf16_prefill_kernel, bitplace_partials_kernel  # noqa: E402
