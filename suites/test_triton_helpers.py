"""The Triton kernels' bit-level helpers (harness/backends/triton_kernels.py), run under the interpreter
on CPU and compiled on a GPU, on the bit patterns that hardware produces and numpy does not: NVIDIA's
canonical NaN is 0x7FFFFFFF, numpy's 0x7FC00000."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.backends import triton_kernels as K
from harness.backends.triton_kernels import tl, triton
from harness.platforms import default_device, triton_version
from reference.moe import round_bf16 as reference_round_bf16


@triton.jit
def _round_bf16_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr + offs, K.round_bf16(x), mask=offs < n)


def test_round_bf16_rounds_like_torch_and_keeps_every_nan_a_nan():
    nan_bits = [0x7FFFFFFF, 0xFFFFFFFF, 0x7FC00000, 0x7F800001, 0xFFBFFFFF]
    other_bits = [0x7F800000, 0xFF800000, 0x7F7FFFFF, 0x00000001, 0x80000000, 0x3F808000, 0x3F818000, 0x3F80C000]
    bits = torch.tensor(nan_bits + other_bits, dtype=torch.int64).to(torch.int32)  # wraps to the same bits
    x = bits.view(torch.float32)
    x = torch.cat([x, torch.randn(64) * 10.0 ** torch.randint(-30, 30, (64,)).float()])
    device = default_device()
    out = torch.empty_like(x, device=device)
    _round_bf16_kernel[(1,)](x.to(device), out, x.numel(), BLOCK=128)
    out = out.cpu()
    n_nan = len(nan_bits)
    assert bool(torch.isnan(out[:n_nan]).all()), out[:n_nan].view(torch.int32).tolist()
    expected = reference_round_bf16(x[n_nan:].double()).float()
    assert torch.equal(out[n_nan:].view(torch.int32), expected.view(torch.int32))


@triton.jit
def _nvfp4_factor_halves_kernel(sw_ptr, even_ptr, odd_ptr, NORMAL: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    even, odd = K._nvfp4_factor_halves(tl.load(sw_ptr + offs), NORMAL)
    tl.store(even_ptr + offs, even)
    tl.store(odd_ptr + offs, odd)


@pytest.mark.parametrize("normal", [1, 2], ids=["exponent_add", "biased_codes"])
def test_the_kernels_nvfp4_factor_words_are_each_codes_value_times_2_to_the_119(normal):
    """triton_kernels._nvfp4_factor_halves itself (interpreted on the CPU, compiled on a GPU), NORMAL 1 (the codes
    as they are) and 2 (stored plus triton_bitplace._NV_BIAS by bitplace_scales): for every normal E4M3 code (NORMAL
    2: every positive one) in every byte position of a word beside random others, the half of the even (bytes 0, 2)
    or odd (1, 3) word is the bf16 bits of the code's value x 2^119, fp4_bits.place_e4m3's value times 2^127 and
    2^112 in bf16 (the multiplies the integer forms replace)."""
    from harness.backends.fp4_bits import place_e4m3
    from harness.backends.triton_bitplace import _NV_BIAS, bitplace_scales

    codes = torch.tensor([c for c in range(256) if (c & 0x78) and (c & 0x7F) != 0x7F and (normal == 1 or c < 0x80)])
    bf = lambda x: torch.tensor(x, dtype=torch.bfloat16)  # noqa: E731
    want = (place_e4m3(codes.to(torch.uint8)) * bf(2.0**127) * bf(2.0**112)).view(torch.int16).to(torch.int64) & 0xFFFF
    g = torch.Generator().manual_seed(7)
    block = 1 << (len(codes) - 1).bit_length()
    device = default_device()
    for pos in range(4):
        words = codes[torch.randint(0, len(codes), (block, 4), generator=g)]
        words[:len(codes), pos] = codes
        stored = bitplace_scales(words.to(torch.uint8)[None], False, 4, _NV_BIAS if normal == 2 else 0)[0]
        sw = stored.contiguous().view(torch.int32).view(-1)
        even, odd = torch.empty_like(sw, device=device), torch.empty_like(sw, device=device)
        _nvfp4_factor_halves_kernel[(1,)](sw.to(device), even, odd, NORMAL=normal, BLOCK=block)
        got = (((even if pos % 2 == 0 else odd).cpu().to(torch.int64) >> (16 * (pos // 2))) & 0xFFFF)[:len(codes)]
        assert torch.equal(got, want), (pos, (got != want).nonzero()[:4].flatten().tolist())


@triton.jit
def _round_to_format_kernel(x_ptr, out_ptr, code_value_ptr, n, MBITS: tl.constexpr, EMIN: tl.constexpr,
                            EMAX: tl.constexpr, MAX_MANTISSA: tl.constexpr, MAX_CODE: tl.constexpr,
                            EBITS: tl.constexpr, BIAS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr + offs, K._round_to_format(x, MBITS, EMIN, EMAX, MAX_MANTISSA), mask=offs < n)
    sign_bit: tl.constexpr = 1 << (EBITS + MBITS)
    code_value = K._decode(K._encode(x, 1.0, MBITS, EMIN, EMAX, MAX_CODE, sign_bit, False), EBITS, MBITS, BIAS)
    tl.store(code_value_ptr + offs, code_value, mask=offs < n)


def test_round_to_format_gives_the_value_of_the_code_for_every_bf16_and_each_tie():
    """_round_to_format (the NVFP4 epilogue's E2M1 values and E4M3 block scales, no codes) against the code round
    trip it replaces (_decode(_encode(x))) and the reference's saturating encode, bit for bit, sign of zero included:
    every finite and infinite bf16 pattern, and fp32 at each rounding tie of the format and one ulp either side."""
    from reference.formats import E2M1, E4M3FN, Overflow, decode, encode

    every_bf16 = (torch.arange(1 << 16, dtype=torch.int32) << 16).view(torch.float32)
    device = default_device()
    # (format, mbits, emin, emax, largest value's mantissa, largest code, ebits, bias)
    for fmt, params in ((E2M1, (1, 0, 2, 1.5, 0x7, 2, 1)), (E4M3FN, (3, -6, 8, 1.75, 0x7E, 4, 7))):
        grid = decode(torch.arange(params[4] + 1, dtype=torch.uint8), fmt).float()
        ties = torch.cat([(grid[1:] + grid[:-1]) / 2, grid[-1:] * 1.25, torch.tensor([2.0**-149])])
        up, down = torch.nextafter(ties, torch.tensor(float("inf"))), torch.nextafter(ties, torch.tensor(0.0))
        x = torch.cat([every_bf16, ties, up, down, -ties, -up, -down])
        x = x[~torch.isnan(x)]
        out, code_value = torch.empty_like(x, device=device), torch.empty_like(x, device=device)
        _round_to_format_kernel[(triton.cdiv(x.numel(), 4096),)](x.to(device), out, code_value, x.numel(), *params,
                                                                BLOCK=4096)
        want = decode(encode(x, fmt, Overflow.SATURATE), fmt).float()
        for name, got in (("the code round trip", code_value), ("_round_to_format", out)):
            bad = (got.cpu().view(torch.int32) != want.view(torch.int32)).nonzero().flatten()
            assert bad.numel() == 0, f"{fmt.name} by {name}: {bad.numel()} differ, e.g. x={x[bad[:4]].tolist()} -> " \
                                     f"{got.cpu()[bad[:4]].tolist()}, reference {want[bad[:4]].tolist()}"


def _routings():
    """(name, topk_ids, num_experts): the shapes that decide the alignment's corner cases."""
    g = torch.Generator().manual_seed(5)
    yield "one token", torch.tensor([[3, 0, 7, 1]]), 8
    yield "every pair to one expert", torch.full((37, 1), 5), 8
    yield "idle experts and a run longer than a block", torch.tensor([[2, 6]] * 19 + [[6, 0]]), 8
    yield "expert ids in reverse", torch.arange(7, -1, -1).reshape(2, 4), 8
    yield "gpt-oss decode (128 experts, top 4)", torch.stack([torch.randperm(128, generator=g)[:4] for _ in range(64)]), 128
    yield "kimi-k2 decode (384 experts, top 8)", torch.stack([torch.randperm(384, generator=g)[:8] for _ in range(128)]), 384
    yield "odd expert count", torch.randint(0, 7, (33, 3), generator=g), 7


def test_the_fused_alignment_equals_the_torch_one():
    """moe_align_kernel (one program; the interpreter here, compiled on a GPU) against _align_torch, the dozen torch
    ops it replaces: the same sorted rows (stable within an expert, sentinel-padded) and block experts, bit for
    bit, at both block heights the tile tables use, up to the 1024 pairs where the fused path stops."""
    from harness.backends.triton_emulation import FUSED_ALIGN_MAX_PAIRS, TritonEmulationBackend

    backend = TritonEmulationBackend()
    device = default_device()
    cases = list(_routings()) + [("the largest fused", torch.randint(0, 256, (FUSED_ALIGN_MAX_PAIRS // 8, 8),
                                                                      generator=torch.Generator().manual_seed(6)), 256)]
    for name, ids, experts in cases:
        for bm in (16,) if name == "the largest fused" else (16, 64):
            got = backend._align(ids.to(device), experts, bm)
            want = backend._align_torch(ids, experts, bm)
            assert torch.equal(got[0].cpu(), want[0]), (name, bm)
            assert torch.equal(got[1].cpu(), want[1]), (name, bm)


def test_the_prefill_alignment_equals_the_torch_one():
    """align_layouts (three launches at any number of pairs: prefill) against the torch ops it replaces
    (align_layouts_torch), bit for bit and at the same sizes: _align_torch's blocks, split_tail_blocks' big and tail blocks, inline_tail_blocks' blocks
    and short flags; across chunks of ALIGN_CHUNK pairs (an expert's rank carried over chunk boundaries), idle
    experts, an expert holding most pairs, 7 / 128 / 384 / 385 experts, more than 16 chunks, int32 ids in a transposed
    view. A rank off by one, a block or a sentinel out of place fails it; tails that do not divide the block are
    refused by name."""
    from harness.backends.triton_emulation import ALIGN_CHUNK, align_layouts, align_layouts_torch

    g = torch.Generator().manual_seed(7)
    skewed = torch.where(torch.rand(3 * ALIGN_CHUNK + 37, 2, generator=g) < 0.6, 3,
                         torch.randint(0, 7, (3 * ALIGN_CHUNK + 37, 2), generator=g))
    cases = list(_routings()) + [
        ("an expert with most pairs, across chunks", skewed, 7),
        ("runs that end on a short block's last row", torch.cat([torch.full((n,), e) for e, n in
                                                                  ((0, 192), (1, 32), (2, 96), (3, 64))])[:, None], 5),
        ("gpt-oss prefill (128 experts, top 4)", torch.stack([torch.randperm(128, generator=g)[:4]
                                                              for _ in range(700)]), 128),
        ("kimi-k2 prefill, idle experts (384, top 8)", torch.stack([torch.randperm(300, generator=g)[:8]
                                                                   for _ in range(300)]), 384),
        # more than 16 chunks (the scan's running counts carried across steps), 385 experts (not a power of two),
        # int32 ids in a transposed view, every pair of the last row to the last expert
        ("17+ chunks, 385 experts, int32 ids transposed", torch.cat([torch.randint(0, 385, (4400,), generator=g),
                                                                     torch.full((100,), 384)]).to(torch.int32)
         .reshape(2, -1).t(), 385)]
    device = default_device()
    for name, ids, experts in cases:
        for block_m, tail_m, inline in ((16, 0, False), (128, 0, False), (128, 32, False), (128, 64, False),
                                        (64, 32, True), (128, 64, True)):
            got = [[None if t is None else t.cpu() for t in layout]
                   for layout in align_layouts(ids.to(device), experts, block_m, tail_m, inline)]
            want = align_layouts_torch(ids, experts, block_m, tail_m, inline)
            assert len(got) == len(want), (name, block_m, tail_m, inline)
            for i, (g_layout, w_layout) in enumerate(zip(got, want)):
                for what, g_t, w_t in zip(("rows", "experts", "short"), g_layout, w_layout):
                    where = (name, f"block_m {block_m}, tail_m {tail_m}, inline {inline}", f"layout {i}", what)
                    assert (g_t is None) == (w_t is None), where
                    assert g_t is None or torch.equal(g_t, w_t.to(g_t.dtype)), where
    for block_m, tail_m, inline in ((128, 48, False), (128, 128, False), (128, 32, True), (64, 0, True)):
        with pytest.raises(ValueError, match="align_layouts takes"):
            align_layouts(cases[0][1], 8, block_m, tail_m, inline)


def test_the_routing_launch_quantizes_gemm1_s_nvfp4_input_bit_for_bit():
    """NVFP4 W4A4 at decode: moe_align_kernel's programs 1.. store x's NVFP4 values (one launch fewer than a
    separate nvfp4_quantize_kernel, issue 28): the routing arrays unchanged and the values nvfp4_quantize_kernel's
    bit for bit, with rows that are not a whole 16-row block, bf16 subnormals, zero blocks and blocks past the
    E4M3 scale's range; the forward then launches no separate NVFP4 quantizer at all (GEMM1's epilogue quantizes
    GEMM2's input), and with the folds off it launches two."""
    from harness.backends import triton_kernels as K
    from harness.backends.triton_emulation import TritonEmulationBackend
    from harness.core.conformance import Shape, case_checkpoint, case_inputs

    backend = TritonEmulationBackend()
    device = default_device()
    g = torch.Generator().manual_seed(3)
    for name, ids, experts in list(_routings())[:3]:
        t = ids.shape[0]
        x = (torch.randn(t, 96, generator=g) * torch.logspace(-40, 3, 96, base=2.0)).to(torch.bfloat16)
        x[0, :16] = 0.0
        x[-1, 16:32] = torch.tensor(9.2e-41).to(torch.bfloat16)  # bf16 subnormals
        x, s_dec = x.to(device), torch.tensor(2.0**-9, device=device)
        values = torch.full_like(x, float("nan"))
        got = backend._align(ids.to(device), experts, 16, nvfp4=(x, s_dec, values))
        want = backend._align_torch(ids, experts, 16)
        assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1]), name
        _, _, ref = backend._nvfp4(x, s_dec, values=True)
        assert torch.equal(values.view(torch.int16), ref.view(torch.int16)), name
        assert ref.abs().max() > 0
    from harness.backends.compile_check import LaunchLog

    shape = Shape(num_experts=4, hidden_size=128, intermediate_size=96, tokens=3, top_k=2)
    ckpt = case_checkpoint("w_nvfp4_a_nvfp4", "SILU", "e4m3fn", shape, 1, False)
    x, w, ids = case_inputs(shape, 1)
    outs, launches = [], []
    real = K.nvfp4_quantize_kernel
    try:
        K.nvfp4_quantize_kernel = log = LaunchLog(real)
        for fold in (True, False):
            backend.fold_epilogues = fold
            before = len(log.grids)
            outs.append(backend.forward(backend.prepare(ckpt), x.to(device), w.to(device), ids.to(device)))
            launches.append(len(log.grids) - before)
    finally:
        K.nvfp4_quantize_kernel = real
    assert launches == [0, 2], launches
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16))


def _compile_for_sm90(cases: list[str], tmp_path, processes: int = 2) -> subprocess.CompletedProcess:
    """harness.backends.compile_check over cases, split round-robin over `processes` concurrent processes (compiling
    is one core's work a process, and CI's machine has two), each with an empty Triton cache of its own so that ptxas
    runs for every launch and its log says whether wgmma was serialized; their outputs joined, case order kept
    within each. A launch two processes both meet is compiled by both (each process compiles a launch once)."""
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, TRITON_INTERPRET="0", MOE_CONFORMANCE_GLUON_NVFP4="1",
               MOE_CONFORMANCE_GLUON_QUANTIZED_ACT="1")
    procs = []
    for share in range(processes):
        cmd = [sys.executable, "-m", "harness.backends.compile_check", "--tokens", "1", "2048", "--intermediate", "384"]
        for case in cases[share::processes]:
            cmd += ["--case", case]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=root,
                                      env=dict(env, TRITON_CACHE_DIR=str(tmp_path / f"cache-{share}"))))
    outputs = [proc.communicate(timeout=600) for proc in procs]
    stdout, stderr = "".join(out for out, _ in outputs), "".join(err for _, err in outputs)
    failed = [proc.returncode for proc in procs if proc.returncode]
    assert not failed, stdout[-3000:] + stderr[-3000:]
    return subprocess.CompletedProcess([], 0, stdout, stderr)


_BF16_TMA = "block_m=128,block_n=128,block_k=64,num_warps=8,num_stages=4,group_m=8,tma=1,tokens=2048"


@pytest.mark.long  # ~2 min on 2 cores: started first
def test_the_kernels_a_forward_launches_compile_for_sm90_without_a_gpu(tmp_path):
    """The interpreter runs a kernel's Python, not the compiler: harness.backends.compile_check records the launches
    of forwards (nothing runs) and compiles each for sm90 with the installed Triton's ptxas, so that a kernel that
    cannot compile (a loop-carried variable changing type: moe_align_kernel's NVFP4 programs once did; returns of
    two types in _weight_tile's bf16 path) fails here rather than on a GPU loan. Every variant in two processes (each
    distinct launch compiled once a process; GEMM2's K 3 chunks, so that loops are compiled, not folded):
    - the table's tiles at one token and 2048 (the decode row with split-K and its epilogues, the prefill row with
      GEMM1's own NVFP4 epilogue), every Triton backend;
    - prefill by TMA (tma 1): bf16 weights interleaved (one 256-row box) and in halves, 8 warps, 4 stages; the
      bit-placement loop's activations (MXFP4, NVFP4 W4A4); bf16 weights alone (tma 2); 128-row blocks with 64-row
      tails (tail_m), in a second launch and inline;
    and that ptxas serialized the asynchronous MMAs (its warning C7515, a silent slowdown) in none of them;
    - the warp-specialised Gluon decode GEMM (harness/backends/gluon_kernels.py): GEMM1 gated, GEMM2 not, MXFP4 and
      NVFP4 (and NVFP4 W4A4: the epilogues apply its scale and quantize GEMM2's input), in each of the consumer's
      three schedules, with one and two consumer warpgroups a program, its layout conversions to the wgmma operand
      asserted trivial by the compiler; pdl 1: the chain as programmatic dependents, each dependent's PTX checked
      against triton_kernels.PDL_ORDER (compile_check.dependent_launch_violations); pdl 2 the same chain with GEMM2
      waiting at entry (no L2 prefetch); NVFP4 factors by multiplies, by an exponent add (NV_NORMAL) and from
      biased codes (NV_NORMAL 2);
      persistent grids with one and two warpgroups, with and without pdl; GEMM1 prefetching its weights into L2
      before its wait (w13_prefetch: PDL 3, the ids its only loads there); the weights tile-major (tile_major);
      and the registered backend's defaults
      (GEMM2's weights of a small model far below GLUON_PDL_BYTES: the chain launches as dependents);
    - the Gluon prefill kernels (gluon_prefill, gluon_bf16).
    The opt-in variants measured slower on the GPU compile in
    test_the_opt_in_variants_measured_slower_compile_for_sm90 (dev and nightly profiles)."""
    from harness.backends.compile_check import LAUNCHED_KERNELS

    # every kernel launch site of the backends is one compile_check records (an unlisted one would really launch)
    sites = {m for f in (Path(__file__).resolve().parents[1] / "harness" / "backends").glob("*.py")
             for m in re.findall(r"\b(?:K|triton_kernels)\.(\w+)\[", f.read_text())}
    assert sites and sites <= set(LAUNCHED_KERNELS), sites - set(LAUNCHED_KERNELS)
    cases = ["triton_bitplace/w_nvfp4_a_nvfp4/SILU", "triton_bitplace/w_nvfp4/SILU@tokens=1,biased_scales=0",
             "triton_bitplace/w_mxfp4/SWIGLUOAI",
             "triton_dot_scaled/w_mxfp4/SWIGLUOAI", "triton_emulation/w_mxfp4_a_mxfp4/SWIGLUOAI",
             "triton_emulation/w_fp8_a_fp8_block/SILU", "triton_emulation/bf16/SILU"]
    bf16_tma = _BF16_TMA
    fp4_tma = "block_m=64,block_n=64,block_k=128,num_warps=4,num_stages=3,group_m=8,tma=1,tokens=2048"
    tma = [f"triton_emulation/bf16/SWIGLUOAI@{bf16_tma}", f"triton_emulation/bf16/SILU@{bf16_tma}",
           f"triton_bitplace/w_mxfp4/SWIGLUOAI@{fp4_tma}", f"triton_bitplace/w_nvfp4_a_nvfp4/SILU@{fp4_tma}",
           f"triton_emulation/bf16/SWIGLUOAI@{bf16_tma.replace('tma=1', 'tma=2')}",
           f"triton_emulation/bf16/SILU@{bf16_tma.replace('tma=1', 'tma=2')}"]
    # 128-row blocks and 64-row tails (tail_m): two launches a GEMM, by TMA and not
    tails = [f"triton_emulation/bf16/SWIGLUOAI@{bf16_tma},tail_m=64",
             "triton_bitplace/w_nvfp4_a_nvfp4/SILU@block_m=128,block_n=64,block_k=128,num_warps=4,num_stages=3,group_m=8,"
             "tail_m=64,tokens=2048"]
    # short blocks in the GEMM's one launch (inline_tails): bf16 weights by TMA, the bit-placement loop
    inline = [f"triton_emulation/bf16/SWIGLUOAI@{bf16_tma.replace('tma=1', 'tma=2')},tail_m=64,inline_tails=1",
              "triton_bitplace/w_mxfp4/SILU@block_m=128,block_n=64,block_k=128,num_warps=4,num_stages=3,group_m=8,"
              "tail_m=64,inline_tails=1,tokens=2048"]
    gluon = {f"triton_bitplace_gluon/{case}@tokens=1,block_m=16,num_warps=4,mma_overlap={overlap},block_n={block_n},"
             f"pdl={pdl},persistent={persistent},exponent_add={int(block_n == 128)},biased_scales={int(pdl != 2)}": pdl
             for overlap, block_n, case, pdl, persistent in (
                 (0, 64, "w_mxfp4/SWIGLUOAI", 0, 0), (1, 64, "w_mxfp4/SWIGLUOAI", 0, 0),
                 (2, 64, "w_mxfp4/SWIGLUOAI", 0, 0), (0, 128, "w_mxfp4/SWIGLUOAI", 0, 1),
                 (2, 128, "w_mxfp4/SWIGLUOAI", 0, 0), (0, 64, "w_nvfp4/SILU", 0, 0), (1, 128, "w_nvfp4/SILU", 0, 0),
                 (0, 64, "w_mxfp4/SWIGLUOAI", 1, 0), (1, 128, "w_nvfp4/SILU", 2, 0),
                 (0, 64, "w_nvfp4_a_nvfp4/SWIGLUOAI", 1, 1))}
    default_gluon = "triton_bitplace_gluon/w_mxfp4/SWIGLUOAI@tokens=1"
    # GEMM1 prefetching its first K chunks of weights into L2 before its wait (w13_prefetch: PDL 3), its block's
    # expert ranked from the ids: one and two warpgroups, MXFP4 and NVFP4
    gluon.update({f"triton_bitplace_gluon/{case}@tokens=1,block_m=16,num_warps=4,block_n={block_n},pdl=1,"
                  f"w13_prefetch={chunks}": 1
                  for case, block_n, chunks in (("w_mxfp4/SWIGLUOAI", 64, 4), ("w_nvfp4/SILU", 128, 99))})
    # the weights tile-major (tile_major: each 64-row tile's K steps one contiguous run), with GEMM1's and GEMM2's
    # prefetches of that layout
    tile_major = {f"triton_bitplace_gluon/{case}@tokens=1,block_m=16,num_warps=4,block_n={block_n},pdl=1,"
                  f"w13_prefetch=4,tile_major=1": 1
                  for case, block_n in (("w_mxfp4/SWIGLUOAI", 64), ("w_nvfp4_a_nvfp4/SILU", 128))}
    gluon.update(tile_major)
    # prefill blocks through the Gluon kernel (gluon_prefill): 64 and 128 pairs a block, two consumer warpgroups and
    # one, MXFP4 and NVFP4 W4A4 (GEMM2's input quantized in GEMM1's epilogue from the accumulators)
    gluon_prefill = [f"triton_bitplace_gluon/{case}@tokens=2048,block_m={bm},block_n={bn},num_warps=4,num_stages=3,"
                     f"maxnreg={128 if (bm, bn) == (64, 64) else 168},group_m=8,gluon_prefill=1,tile_major=1"
                     for case, bm, bn in (("w_mxfp4/SWIGLUOAI", 64, 128), ("w_nvfp4_a_nvfp4/SILU", 128, 64))]
    # bf16 prefill through the Gluon kernel (gluon_bf16): the opt-in row (interleaved gate and up rows as row pairs,
    # 128-pair blocks with each expert's short block inline, one persistent program a multiprocessor), and halves at
    # 64-pair blocks on the plain grid
    gluon_bf16 = [f"triton_emulation/bf16/{act}@tokens=2048,block_m={bm},block_n=128,w2_block_n=256,block_k=64,"
                  f"num_warps=4,num_stages=4,maxnreg=168,group_m=8,gluon_bf16=1{more}"
                  for act, bm, more in (("SWIGLUOAI", 128, ",persistent=1,tail_m=64,inline_tails=1"), ("SILU", 64, ""))]
    every = cases + tma + tails + inline + list(gluon) + [default_gluon] + gluon_prefill + gluon_bf16
    run = _compile_for_sm90(every, tmp_path)
    compiled = {line.split()[1] for line in run.stdout.splitlines() if line.startswith("compiled ")}
    assert compiled >= {"moe_align_kernel", "moe_gemm_kernel", "splitk_epilogue_kernel", "splitk_topk_reduce_kernel",
                        "mx_quantize_kernel", "nvfp4_quantize_kernel", "fp8_quantize_kernel", "topk_reduce_kernel",
                        "bitplace_partials_kernel"}, run.stdout
    launched = {line.split(", ")[0][5:]: line for line in run.stdout.splitlines() if line.startswith("case ")}
    for case in tma:
        assert "moe_gemm_kernel x2" in launched[case], launched[case]
    for case in tails:
        assert "moe_gemm_kernel x4" in launched[case], launched[case]
    for case in inline:
        assert "moe_gemm_kernel x2" in launched[case], launched[case]
    # ptxas keeps every kernel's asynchronous MMAs in flight (compile_check.compile_with_ptxas_log)
    compiled_lines = [line for line in run.stdout.splitlines() if line.startswith("compiled ")]
    for kernel in ("moe_gemm_kernel", "bitplace_partials_kernel"):  # (a launch Triton's cache had: no ptxas log)
        assert any(f"compiled {kernel} " in line and " registers, " in line for line in compiled_lines), kernel
    serialized = [line for line in compiled_lines if "wgmma serialized" in line and "persistent=" not in line]
    assert not serialized, serialized[:3]
    # both GEMMs by the Gluon kernel; GEMM1, its epilogue, GEMM2 and the top-k sum each a dependent that waits first
    for case, pdl in list(gluon.items()) + [(default_gluon, 1)]:
        assert "bitplace_partials_kernel x2" in launched[case], launched[case]
        assert launched[case].endswith(f" {4 if pdl else 0} dependents"), launched[case]
    # GEMM1 of the four w13_prefetch cases and of the table's defaults (the small model's GEMM1 weights fit
    # GLUON_W13_PREFETCH_BYTES) prefetch before their wait
    assert sum("bitplace_partials_kernel (PDL 3)" in line for line in run.stdout.splitlines()) == 5, run.stdout[-2000:]
    for case in gluon_prefill:  # both GEMMs finish their tiles (no epilogue kernel), warp-specialized, no spill
        assert "bitplace_partials_kernel x2, topk_reduce_kernel x1)" in launched[case], launched[case]
        assert "splitk" not in launched[case], launched[case]
        lines = [line for line in run.stdout.splitlines()
                 if line.startswith("compiled bitplace_partials_kernel") and f"{case}, 2048 tokens;" in line]
        assert len(lines) == 2 and all(" 0 spill bytes" in line and "warp-specialized" in line for line in lines), \
            lines or run.stdout[-2000:]
    # both GEMMs, their epilogues from the accumulators, warp-specialized, in 227 KB, no spill but 4 bytes where the
    # consumers (224 registers: 168 x 3 warpgroups less the producer's 56) hold both the full and the short block's
    # code, persistent, with SWIGLUOAI's epilogue (Triton 3.6; a larger share for both consumers is not left over)
    for case in gluon_bf16:
        assert "bf16_prefill_kernel x2, topk_reduce_kernel x1)" in launched[case], launched[case]
        lines = [line for line in run.stdout.splitlines()
                 if line.startswith("compiled bf16_prefill_kernel") and f"{case}, 2048 tokens;" in line]
        spill = 4 if "inline" in case else 0
        assert len(lines) == 2 and all(int(re.search(r"(\d+) spill bytes", line).group(1)) <= spill
                                       and "warp-specialized" in line
                                       and float(re.search(r"([\d.]+) KB shared", line).group(1)) <= 227
                                       for line in lines), lines or run.stdout[-2000:]
    for case in [*tile_major, default_gluon]:  # both GEMMs read the tile-major copy (the table's default too)
        assert sum(line.startswith("compiled bitplace_partials_kernel") and f"{case}, 1 tokens;" in line
                   and "tile-major weights" in line for line in run.stdout.splitlines()) == 2, run.stdout[-2000:]


@pytest.mark.long
def test_the_opt_in_variants_measured_slower_compile_for_sm90(tmp_path, hypothesis_profile):
    """As test_the_kernels_a_forward_launches_compile_for_sm90_without_a_gpu, for the opt-in variants the GPU measured
    slower and no tile table takes (kept for A/B runs): split-K finished in the GEMM's own launch (serial_k:
    moe_gemm_kernel, and the Gluon kernel split with pdl and unsplit on two warpgroups; run-22), block scales a K step
    ahead by plain loads (scale_regs; run-33), the bf16 TMA loop warp-specialized by Triton (warp_spec; run-24) and
    moe_gemm_kernel's persistent grids (run-19). ~40 s of one core's compiling: the ci profile (make test on CI's two
    cores, 10 minutes) leaves them to dev and nightly."""
    if hypothesis_profile == "ci":
        pytest.skip("ci profile: the opt-in variants measured slower compile in dev and nightly")
    # split-K finished in the GEMM's launch by each tile's last split (serial_k; GEMM1 quantizing GEMM2's NVFP4 input)
    serial = ("triton_bitplace/w_nvfp4_a_nvfp4/SILU@block_m=16,block_n=64,block_k=128,num_warps=4,num_stages=3,"
              "split_k=2,serial_k=1,tokens=1")
    # the Gluon kernel's (SERIAL): split with pdl (GEMM1 quantizing GEMM2's NVFP4 input), unsplit on two warpgroups
    gluon_serial = {"triton_bitplace_gluon/w_nvfp4_a_nvfp4/SWIGLUOAI@tokens=1,block_m=16,num_warps=4,block_n=64,"
                    "split_k=2,pdl=1,serial_k=1": 1,
                    "triton_bitplace_gluon/w_mxfp4/SWIGLUOAI@tokens=1,block_m=16,num_warps=4,block_n=128,split_k=1,"
                    "serial_k=1": 0}
    # block scales a K step ahead by plain loads (scale_regs): NVFP4's 128-row 4-warp GEMM1 in at most 113 KB of
    # shared memory where Triton is the H200 image's (two programs a multiprocessor)
    scale_regs = ("triton_bitplace/w_nvfp4_a_nvfp4/SILU@block_m=128,block_n=64,block_k=128,num_warps=4,num_stages=3,"
                  "group_m=8,scale_regs=1,tokens=2048")
    # the bf16 TMA loop warp-specialized by Triton (warp_spec): interleaved gate and up rows as row pairs, and halves
    # at 4 warps and 2 stages (more stages: wrong outputs on the H200, results/gpu-issue28/run-24)
    bf16_ws = _BF16_TMA.replace("num_warps=8", "num_warps=4").replace("num_stages=4", "num_stages=2")
    warp_specialized = [f"triton_emulation/bf16/{act}@{bf16_ws},warp_spec=1,w2_block_n=256"
                        for act in ("SWIGLUOAI", "SILU")]
    # persistent grids of moe_gemm_kernel (one flattened loop over the used blocks' tiles): bf16 by TMA, tails
    persistent = [f"triton_emulation/bf16/SILU@{_BF16_TMA.replace('tma=1', 'tma=2')},persistent=1,w2_block_n=256",
                  "triton_bitplace/w_mxfp4/SWIGLUOAI@block_m=128,block_n=64,block_k=128,num_warps=4,num_stages=3,"
                  "group_m=8,tail_m=64,persistent=2,tokens=2048"]
    run = _compile_for_sm90([serial, scale_regs] + warp_specialized + persistent + list(gluon_serial), tmp_path)
    launched = {line.split(", ")[0][5:]: line for line in run.stdout.splitlines() if line.startswith("case ")}
    assert "moe_gemm_kernel x2, splitk_topk_reduce_kernel x1)" in launched[serial], launched[serial]
    for case, pdl in gluon_serial.items():  # no splitk_epilogue_kernel: GEMM1 finishes its tiles itself
        assert "bitplace_partials_kernel x2, splitk_topk_reduce_kernel x1)" in launched[case], launched[case]
        assert launched[case].endswith(f" {3 if pdl else 0} dependents"), launched[case]
    if triton_version() <= (3, 6):  # the H200 image's; Triton 3.9 (CI's) spills this tile and takes 116 KB
        gemm1 = next(line for line in run.stdout.splitlines()
                     if line.startswith("compiled moe_gemm_kernel") and scale_regs in line)
        assert float(re.search(r"([\d.]+) KB shared", gemm1).group(1)) <= 113, gemm1
    for case in warp_specialized:  # both GEMMs: a producer warpgroup and two consumer warpgroups (setmaxnreg)
        assert "moe_gemm_kernel x2" in launched[case], launched[case]
        partitioned = [line for line in run.stdout.splitlines()
                       if line.startswith("compiled moe_gemm_kernel ") and f"{case}, 2048 tokens;" in line]
        assert len(partitioned) == 2 and all("warp-specialized: 384 threads" in line for line in partitioned), \
            partitioned or run.stdout[-2000:]
    for case in persistent:
        assert "moe_gemm_kernel x" in launched[case], launched[case]
    # ptxas keeps the asynchronous MMAs in flight but in the persistent grids: their flattened loop resets the
    # accumulators between MMAs (run-19: 1.1-2x slower)
    serialized = [line for line in run.stdout.splitlines()
                  if line.startswith("compiled ") and "wgmma serialized" in line and "persistent=" not in line]
    assert not serialized, serialized[:3]



def test_the_fp4_block_factors_reach_the_packed_multiplies_by_operand_selector_not_byte_permutes(tmp_path):
    """The bit-placement K loop (triton_bitplace, MXFP4 and NVFP4, compiled for sm90 on the CPU by
    tools/count_loop_instructions): each block factor is half of a word of two (triton_kernels.HALF_SELECT,
    _scaled_halves_bf16_half), which ptxas reads in place through the packed multiply's operand selector (HMUL2 ...
    R.H0_H0 / R.H1_H1), so the loop holds no byte permute (prmt) doubling factors: Triton 3.6, NVFP4 decode 514 ->
    482 SASS a K step, MXFP4 439 -> 423. Doubled factors (MOE_CONFORMANCE_HALF_SELECT=0) fail it: PRMT (NVFP4 32,
    MXFP4 8), no selector. NVFP4's factor words from biased codes are one LOP3 each (_nv_biased_factor_pairs), from
    words stored rotated (the odd ones one funnel rotate first, the even ones nothing)."""
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run([sys.executable, "tools/count_loop_instructions.py", "--tokens", "8", "--path",
                          "w_nvfp4/triton_bitplace", "--path", "w_mxfp4/triton_bitplace", "--sass", str(tmp_path)],
                         capture_output=True, text=True, cwd=root, timeout=600,
                         env=dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "cache"), OUT=str(tmp_path)))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    loops = sorted(tmp_path.glob("*.sass"))
    assert [f.name.split("-")[-2] for f in loops] == ["w_mxfp4", "w_nvfp4"], loops
    for f in loops:
        listing = [line for line in f.read_text().splitlines()
                   if re.match(r"[A-Z]", line)]  # the loop's instructions (the opcode histogram lines are indented)
        multiplies = [line for line in listing if line.startswith("HMUL2")]
        assert len(multiplies) == 64, (f.name, multiplies[:4])  # 4 pairs x 4 words x 2 rows x gate and up a thread
        assert all(re.search(r"\.H([01])_H\1\b", line) for line in multiplies), (f.name, multiplies[:4])
        assert not [line for line in listing if line.startswith("PRMT")], (f.name, listing[:8])
        if "w_nvfp4" in f.name:
            # NVFP4's biased codes (NV_NORMAL 2): each word of two factors one shift and one three-input LOP3
            # ((a & 0x0FF00FF0) | c, LUT 0xEA, c = 0x70007000 in a register: _nv_biased_factor_pairs), not an and and
            # an or with an immediate each (13-15 SASS more a K step)
            factors = [line for line in listing if line.startswith("LOP3") and "0xff00ff0" in line and "0xea" in line]
            assert len(factors) == 16, (f.name, factors[:4])  # even and odd x 2 scale words x 2 rows x gate and up
            assert not [line for line in listing if line.startswith("LOP3") and "0x70007000" in line], f.name
            # the stored words rotated left by 4 bits (triton_bitplace._rotate_words_left_4): the even factor words
            # take no shift, the odd ones one 8-bit funnel rotate each (_rotate_right_8): 8 SASS fewer a K step
            rotates = [line for line in listing if line.startswith("SHF.R.W.U32") and " 0x8," in line]
            assert len(rotates) == 8, (f.name, rotates[:4])  # odd x 2 scale words x 2 rows x gate and up


def test_a_dependent_launch_that_reads_or_writes_before_its_wait_is_reported():
    """compile_check.dependent_launch_violations on PTX as the compiler writes it: a dependent that never waits,
    stores before its wait, or loads before it (beyond GEMM2's one load of its block's expert) is reported."""
    from harness.backends.compile_check import dependent_launch_violations as violations

    wait = "griddepcontrol.wait; // dummy %r1"
    load = "ld.global.b32 { %r2 }, [ %rd1 + 0 ];"
    store = "st.global.b32 [ %rd2 + 0 ], { %r3 };"
    prefetch = "{ .reg .pred p; setp.ne.s32 p, %r4, 0; @p cp.async.bulk.prefetch.L2.global [%rd3], %r5; }"
    assert violations("\n".join([wait, load, store]), {"PDL": True}) == []
    assert violations("\n".join([load, prefetch, wait, load]), {"PDL": 2}) == []
    assert "never waits" in violations("\n".join([load, store]), {"PDL": True})[0]
    assert "writes" in violations("\n".join([store, wait]), {"PDL": True})[0]
    assert "global loads" in violations("\n".join([load, wait]), {"PDL": 1})[0]
    assert "global loads" in violations("\n".join([load, load, prefetch, wait]), {"PDL": 2})[0]
    assert "writes" in violations("\n".join(["cp.async.ca.shared.global [%r1], [%rd1], 16;", wait]), {"PDL": 2})[0]
    # guarded by a predicate, as Triton writes masked stores, atomics and TMA copies
    assert "writes" in violations("\n".join(["@%p1 st.global.b32 [ %rd2 + 0 ], { %r3 };", wait]), {"PDL": 1})[0]
    assert "writes" in violations("\n".join(["@!%p2 atom.global.add.u32 %r1, [%rd1], 1;", wait]), {"PDL": 1})[0]
    assert "global loads" in violations("\n".join(["@%p3 ld.global.nc.v4.b32 {%r1}, [%rd1];", wait]), {"PDL": 1})[0]
    # GEMM1's PDL 3: the expert ids (loads marked evict_last) before its wait, nothing else
    ids = "@%p23 ld.global.L1::evict_last.L2::cache_hint.b64 { %rd72 }, [ %rd73 + 0 ], %rd74;"
    assert violations("\n".join([ids, ids, prefetch, wait, load]), {"PDL": 3}) == []
    assert "global loads" in violations("\n".join([ids, load, prefetch, wait]), {"PDL": 3})[0]
    assert "global loads" in violations("\n".join([ids, wait]), {"PDL": 1})[0]


def test_the_activation_quantizers_read_bf16_exactly_subnormals_included():
    """The fused forward hands its bf16 activations to the quantizer kernels with no fp32 copy (they upcast on
    load): codes, scales and values must be those of the fp32 copy, bf16 subnormals included (the interpreter's
    own bf16 -> fp32 conversion gets them wrong: Triton 3.9 turned 9.2e-41 into 0)."""
    from harness.backends.triton_emulation import TritonEmulationBackend
    from reference.formats import E2M1, E4M3FN
    from reference.mx import ScaleMode

    backend = TritonEmulationBackend()
    g = torch.Generator().manual_seed(3)
    tiny = torch.randn(16, 128, generator=g) * 2.0 ** torch.randint(-140, -118, (16, 1), generator=g).float()
    x = torch.cat([tiny, torch.randn(4, 128, generator=g)]).to(torch.bfloat16).to(default_device())
    assert bool(((x.float().abs() < 2.0**-126) & (x != 0)).sum() > 100), "the rows must hold bf16 subnormals"
    runs = {"MX (E2M1, floor)": lambda a: backend._mx(a, E2M1, ScaleMode.FLOOR, values=True),
            "NVFP4 (s_dec 2^-126)": lambda a: backend._nvfp4(a, torch.tensor(2.0**-126), values=True),
            "FP8 E4M3 per 1x128": lambda a: backend._fp8(a, E4M3FN, None, 128, values=True)}
    for name, run in runs.items():
        for what, got, want in zip(("codes", "scales", "values"), run(x), run(x.float())):
            assert torch.equal(got.cpu(), want.cpu()), f"{name}: {what} from bf16 differ from the fp32 copy's"
        assert bool((run(x)[0].cpu()[:16] != 0).any()) or name.startswith("FP8"), f"{name}: the tiny rows all quantized to 0"


@triton.jit
def _grouped_order_kernel(out_ptr, GROUP_M: tl.constexpr):
    pid_m, pid_n = K.grouped_tile_order(tl.program_id(0), tl.program_id(1), tl.num_programs(0), tl.num_programs(1),
                                        GROUP_M)
    slot = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    tl.store(out_ptr + 2 * slot, pid_m)
    tl.store(out_ptr + 2 * slot + 1, pid_n)


def test_the_grouped_tile_order_visits_every_tile_once_a_group_at_a_time():
    """grouped_tile_order maps the launch slots (row blocks fastest) onto the (row block, N block) tiles one to one,
    GROUP_M row blocks at a time and each group's N blocks in turn, the last group short where GROUP_M does not
    divide the row blocks (7 = 3 + 3 + 1)."""
    m_blocks, n_blocks, group = 7, 5, 3
    out = torch.full((m_blocks * n_blocks, 2), -1, dtype=torch.int32, device=default_device())
    _grouped_order_kernel[(m_blocks, n_blocks)](out, GROUP_M=group)
    got = [tuple(t) for t in out.cpu().tolist()]
    want = [(first + i, n) for first in range(0, m_blocks, group) for n in range(n_blocks)
            for i in range(min(group, m_blocks - first))]
    assert got == want
    assert sorted(got) == [(m, n) for m in range(m_blocks) for n in range(n_blocks)]


def test_the_grouped_tile_order_gives_the_same_bits():
    """group_m only reorders which tiles run together: the dequantizing loop (bf16 and MXFP4 weights) and the
    bit-placement loop give bit for bit the outputs of the plain order, with more row and N blocks than a group."""
    from harness.backends import load_backend
    from harness.core.conformance import Shape, backend_shape, case_checkpoint, case_inputs

    for kernel, scheme in (("triton_emulation", "bf16"), ("triton_emulation", "w_mxfp4"),
                           ("triton_bitplace", "w_nvfp4")):
        outs = []
        for group_m in (0, 3):
            backend = load_backend(kernel).configure(block_m=16, block_n=64, block_k=128 if "bitplace" in kernel
                                                     else 32, num_warps=4, num_stages=2, group_m=group_m)
            shape = backend_shape(backend, Shape(num_experts=3, hidden_size=256, intermediate_size=160, tokens=20,
                                                 top_k=2))
            ckpt = case_checkpoint(scheme, "SWIGLUOAI", "e4m3fn", shape, seed=5, bias=True)
            x, w, ids = case_inputs(shape, 6)
            outs.append(backend.forward(backend.prepare(ckpt), x, w, ids))
        assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16)), (kernel, scheme)
        assert outs[0].abs().sum() > 0


def test_activations_and_bf16_weights_by_tma_give_the_same_bits(monkeypatch):
    """tma 1 (moe_gemm_kernel's A_TMA / W_TMA): the activation rows gathered block by block (gather_block_rows) and
    read as TMA boxes, bf16 weights as boxes of [E x N_ROWS, K] (gate and up interleaved: one box of both and one
    MMA, the accumulator's columns split after the loop; halves: two boxes), the bit-placement loop's activations
    likewise (two MMA steps a chunk: two boxes); tma 2 the bf16 weights' boxes only, the activations by pointers: bit
    for bit the pointer loads' outputs, with K tails (160 = 2.5 steps of 64), tiles past N_OUT, padding rows and
    biases, gated and not (GEMM2)."""
    from harness.backends import load_backend, triton_emulation
    from harness.core.conformance import Shape, backend_shape, case_checkpoint, case_inputs

    boxes = []
    from_tensor = triton_emulation.TensorDescriptor.from_tensor
    monkeypatch.setattr(triton_emulation.TensorDescriptor, "from_tensor",
                        staticmethod(lambda t, box: boxes.append(box) or from_tensor(t, box)))
    for kernel, scheme, act, more in (("triton_emulation", "bf16", "SWIGLUOAI", {}),
                                      ("triton_emulation", "bf16", "SILU", {}),
                                      ("triton_bitplace", "w_mxfp4", "SWIGLUOAI", dict(mma_steps=2))):
        outs = []
        for tma in (0, 1, 2) if kernel == "triton_emulation" else (0, 1):
            backend = load_backend(kernel).configure(block_m=16, block_n=64, block_k=128 if "bitplace" in kernel
                                                     else 64, num_warps=4, num_stages=2, tma=tma, **more)
            shape = backend_shape(backend, Shape(num_experts=3, hidden_size=160, intermediate_size=96, tokens=9,
                                                 top_k=2))
            ckpt = case_checkpoint(scheme, act, "e4m3fn", shape, seed=7, bias=True)
            x, w, ids = case_inputs(shape, 8)
            outs.append(backend.forward(backend.prepare(ckpt), x, w, ids))
        for out in outs[1:]:
            assert torch.equal(outs[0].view(torch.int16), out.view(torch.int16)), (kernel, scheme, act)
        assert outs[0].abs().sum() > 0
    # GEMM1 and GEMM2 of each: the activations' boxes, and the bf16 weights' ([2 x 64] rows interleaved, 64 halves);
    # tma 2 the weights' alone
    assert boxes == [[16, 64], [128, 64], [16, 64], [64, 64], [128, 64], [64, 64],
                     [16, 64], [64, 64], [16, 64], [64, 64], [64, 64], [64, 64],
                     [16, 64], [16, 64]], boxes


def _tail_blocks_by_loop(sorted_rows, block_expert, tail_m, block_m, num_experts, n_pairs):
    """split_tail_blocks' oracle, one expert at a time."""
    ratio = block_m // tail_m
    small = [(e, sorted_rows[i * tail_m:(i + 1) * tail_m].tolist()) for i, e in enumerate(block_expert.tolist())
             if e >= 0]
    big, tail = [], []
    for e in range(num_experts):
        mine = [rows for owner, rows in small if owner == e]
        n_big = len(mine) // ratio
        big += [(e, sum(mine[j * ratio:(j + 1) * ratio], [])) for j in range(n_big)]
        tail += [(e, rows) for rows in mine[n_big * ratio:]]
    return big, tail


def test_tail_blocks_regroup_the_aligned_blocks_of_each_expert():
    """split_tail_blocks against a loop over experts: blocks of block_m rows (runs of block_m / tail_m small blocks of
    one expert) then the tail blocks left, the unused slots of the worst-case sizes expert -1 and all padding; experts
    with no rows, an exact multiple of block_m, and fewer rows than one tail block."""
    from harness.backends.triton_emulation import TritonEmulationBackend, split_tail_blocks

    counts = [0, 64, 5, 37, 100, 16]  # rows of experts 0-5 (in pairs)
    ids = torch.cat([torch.full((c,), e) for e, c in enumerate(counts)])
    ids = ids[torch.randperm(len(ids), generator=torch.Generator().manual_seed(3))].reshape(-1, 1)
    p, num_experts = ids.numel(), len(counts)
    for tail_m, block_m in ((16, 32), (16, 64), (32, 64)):
        rows, experts = TritonEmulationBackend._align_torch(ids, num_experts, tail_m)
        got = split_tail_blocks(rows, experts, tail_m, block_m, num_experts, p)
        want = _tail_blocks_by_loop(rows, experts, tail_m, block_m, num_experts, p)
        for (g_rows, g_experts), w_blocks, width in zip(got, want, (block_m, tail_m)):
            assert g_rows.numel() == g_experts.numel() * width and g_rows.dtype == g_experts.dtype == torch.int32
            used = [(e, g_rows[i * width:(i + 1) * width].tolist()) for i, e in enumerate(g_experts.tolist()) if e >= 0]
            assert used == w_blocks, (tail_m, block_m)
            assert g_experts[len(used):].eq(-1).all() and g_rows[len(used) * width:].eq(p).all()
        seen = torch.cat([r[r < p] for r, _ in got])
        assert torch.equal(seen.sort().values, torch.arange(p, dtype=torch.int32))


def test_fit_tail_m_leaves_an_expert_the_fewest_tail_blocks():
    """fit_tail_m against split_tail_blocks itself: for an expert of n rows, the tail_m it picks gives the fewest tail
    blocks of the choices below block_m, the smaller on a tie; the bench models' 8192-token prefill gets the tails
    that ran fastest on the H200 (gpt-oss-120b 32, Kimi-K2 64); no choice, no tails; the table row's fit_tail_m
    resolves to the call's tail_m."""
    from types import SimpleNamespace

    from harness.backends.triton_bitplace import TritonBitplaceBackend
    from harness.backends.triton_emulation import TAIL_M_CHOICES, TritonEmulationBackend, fit_tail_m, split_tail_blocks

    def tail_blocks(rows: int, tail_m: int, block_m: int) -> int:
        ids = torch.zeros(rows, 1, dtype=torch.int64)
        sorted_rows, block_expert = TritonEmulationBackend._align_torch(ids, 1, tail_m)
        _, (_, tail_experts) = split_tail_blocks(sorted_rows, block_expert, tail_m, block_m, 1, rows)
        return int((tail_experts >= 0).sum())

    for block_m in (64, 128):
        for rows in (1, 31, 33, 64, 100, 150, 171, 200, 240, 256, 257, 300):
            counts = {t: tail_blocks(rows, t, block_m) for t in TAIL_M_CHOICES if t < block_m}
            best = min(counts, key=lambda t: (counts[t], t))
            assert fit_tail_m(rows, block_m) == best, (rows, block_m, counts)
    assert fit_tail_m(8192 * 4 / 128, 128) == 32 and fit_tail_m(8192 * 8 / 384, 128) == 64
    assert fit_tail_m(200, 32) == 0
    prepared = SimpleNamespace(ckpt=SimpleNamespace(num_experts=384))
    tiles = TritonBitplaceBackend().resolve_tiles(dict(block_m=128, fit_tail_m=1), prepared, 8192 * 8, "cpu")
    assert tiles == dict(block_m=128, tail_m=64), tiles


def test_tail_blocks_give_the_same_bits():
    """tail_m: each expert's rows in blocks of block_m plus tail blocks of tail_m rows, two launches a GEMM, give bit
    for bit the outputs of one launch of tail_m-row blocks (a tile's rows do not meet in the K reduction), on the
    dequantizing loop (bf16, MXFP4 W4A4), the bit-placement loop (NVFP4 W4A4, GEMM1's epilogue quantizing) and
    prefill by TMA; so do the short blocks in the GEMM's one launch (inline_tails: bf16 weights by TMA, the
    bit-placement loop). (The interpreter's fp32 dot is numpy's BLAS, whose summation order may change with the
    tile's rows and with the CPU it runs on: MXFP4 W4A16 is 1 ulp off at one output between 16- and 32-row tiles, two
    launches or one, in both loops on some CPUs; W4A4's FP4 x FP4 products do not show it.)"""
    for kernel, scheme, more in (("triton_emulation", "bf16", {}), ("triton_emulation", "w_mxfp4_a_mxfp4", {}),
                                 ("triton_bitplace", "w_nvfp4_a_nvfp4", {}), ("triton_emulation", "bf16", dict(tma=1)),
                                 ("triton_emulation", "bf16", dict(tma=2, inline_tails=1)),
                                 ("triton_bitplace", "w_nvfp4_a_nvfp4", dict(inline_tails=1))):
        outs = []
        for tiles in (dict(block_m=16), dict(block_m=32, tail_m=16)):
            backend, out = _small_prefill_forward(kernel, scheme, {**tiles, **more})
            outs.append(out)
        assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16)), (kernel, scheme, more)
        assert outs[0].abs().sum() > 0
        launches = {"w13", "w2"} if more.get("inline_tails") else {"w13", "w2", "w13_tail", "w2_tail"}
        assert set(backend.last_launch) == launches, (backend.last_launch, more)


def test_the_tail_launch_takes_its_own_warps_and_n_tile_with_the_same_bits():
    """tail_warps / tail_block_n: the tail launch (tail_m's second launch of each GEMM) at its own num_warps and N tile
    (NVFP4 W4A16's 8-warp 128-column row leaves its 32-row tails one program a multiprocessor: results/gpu-issue28/
    run-39), the main launch as it was; bit for bit the forward without them (an output's K reduction does not depend
    on how many rows or columns a tile holds), on the bit-placement loop and the dequantizing one."""
    for kernel, scheme in (("triton_bitplace", "w_nvfp4"), ("triton_bitplace", "w_nvfp4_a_nvfp4"),
                           ("triton_emulation", "w_mxfp4_a_mxfp4")):
        base = dict(block_m=32, tail_m=16, block_n=128, num_warps=8)
        outs = []
        for more in ({}, dict(tail_warps=4, tail_block_n=64)):
            backend, out = _small_prefill_forward(kernel, scheme, {**base, **more})
            outs.append(out)
            for gemm in ("w13", "w2"):
                main, tail = backend.last_launch[gemm][1], backend.last_launch[f"{gemm}_tail"][1]
                assert (main["num_warps"], main["block_n"], main["block_m"]) == (8, 128, 32), (kernel, main)
                assert (tail["num_warps"], tail["block_n"], tail["block_m"]) == ((more.get("tail_warps") or 8),
                                                                                  more.get("tail_block_n") or 128, 16)
        assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16)), (kernel, scheme)
        assert outs[0].abs().sum() > 0
    with pytest.raises(ValueError, match="need tail_m without inline_tails"):
        _small_prefill_forward("triton_emulation", "bf16", dict(block_m=32, tail_warps=4))
    with pytest.raises(ValueError, match="a multiple of 128"):  # 8 bit-placement warps: 128 weight rows at least
        _small_prefill_forward("triton_bitplace", "w_nvfp4", dict(block_m=32, tail_m=16, block_n=128, num_warps=4,
                                                                  tail_warps=8, tail_block_n=64))


def test_quant_launch_quantizes_nvfp4_activations_in_their_own_launches_with_the_same_bits(monkeypatch):
    """quant_launch 1 (NVFP4 W4A4): GEMM1's and GEMM2's inputs by nvfp4_quantize_kernel's own launches, not folded into
    the routing launch and GEMM1's epilogue; bit for bit the folded forward's output, on tiles with tail blocks too
    (tools/tune_moe.py --set quant_launch=1 times the one against the other)."""
    from harness.backends import triton_kernels as K
    from harness.backends.compile_check import LaunchLog

    for tiles in (dict(block_m=16), dict(block_m=32, tail_m=16)):
        outs, launches = [], []
        for quant_launch in (0, 1):
            log = LaunchLog(K.nvfp4_quantize_kernel)
            monkeypatch.setattr(K, "nvfp4_quantize_kernel", log)
            outs.append(_small_prefill_forward("triton_bitplace", "w_nvfp4_a_nvfp4",
                                               {**tiles, "quant_launch": quant_launch}, "SILU")[1])
            launches.append(len(log.grids))
            monkeypatch.setattr(K, "nvfp4_quantize_kernel", log.kernel)
        assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16)), tiles
        assert outs[0].abs().sum() > 0
        assert launches == [0, 2], (tiles, launches)


def test_the_values_only_nvfp4_launch_gives_the_quantizers_values_bit_for_bit():
    """The forward's NVFP4 activations (_nvfp4_values: 32 x 128 programs, values alone by _nvfp4_block_values) are the
    values of the quantizer entry point's launch (_nvfp4: 16 x 16 programs, codes decoded) bit for bit: rows and
    columns that are not whole programs, bf16 subnormals, zero blocks, blocks past the E4M3 scale's range, infinite
    elements (GEMM1's outputs may overflow bf16), tensor scales from 2^-126 to 3e4; and each value is the reference
    quantizer's (reference.nvfp4.quantize_nvfp4 decoded without the tensor scale)."""
    from harness.backends.triton_emulation import TritonEmulationBackend
    from reference.nvfp4 import dequantize_nvfp4, quantize_nvfp4

    backend = TritonEmulationBackend()
    device = default_device()
    g = torch.Generator().manual_seed(5)
    for rows, cols in ((37, 96), (5, 272)):
        x = (torch.randn(rows, cols, generator=g) * torch.logspace(-40, 3, cols, base=2.0)).to(torch.bfloat16)
        x[0, :16] = 0.0
        x[1, 16:32] = torch.tensor(9.2e-41).to(torch.bfloat16)  # bf16 subnormals
        x[2, :16] *= 2.0**90  # past 448 x 6 x s_dec: the E4M3 scale saturates
        x[3, 3], x[4, 20] = float("inf"), float("-inf")
        x = x.to(device)
        for s_dec in (2.0**-9, 0.37, 2.0**-126, 3e4):
            s = torch.tensor(s_dec)
            got = backend._nvfp4_values(x, s)
            want = backend._nvfp4(x, s, values=True)[2]
            assert torch.equal(got.view(torch.int16), want.view(torch.int16)), (rows, cols, s_dec)
            finite = torch.isfinite(x.float()).all(dim=1).cpu()
            q = quantize_nvfp4(x.float().cpu()[finite], global_decode_scale=s)
            ref = dequantize_nvfp4(q.codes, q.block_scales, torch.tensor(1.0), torch.bfloat16)  # exact in bf16
            assert torch.equal(got.cpu()[finite].view(torch.int16), ref.view(torch.int16)), (rows, cols, s_dec)
    with pytest.raises(ValueError, match="divisible by 16"):
        backend._nvfp4_values(torch.zeros(2, 40, dtype=torch.bfloat16, device=device), torch.tensor(1.0))


def test_the_top_k_sum_gives_the_same_bits_at_every_program_width():
    """topk_reduce_kernel at the wide programs of prefill (topk_reduce_block_h: 1024 columns once the tokens fill the
    GPU) gives the bits of its 128-column programs, columns past the last whole program masked (300 = 1024 - 724)."""
    from harness.backends import triton_kernels as K
    from harness.backends.triton_emulation import (SEPARATE_ROUNDINGS, TOPK_BLOCK_H, TOPK_WIDE_BLOCK_H,
                                                   topk_reduce_block_h)

    assert topk_reduce_block_h(8192, 2880, 132) == TOPK_WIDE_BLOCK_H and topk_reduce_block_h(8, 2880, 132) == 128
    device = default_device()
    g = torch.Generator().manual_seed(7)
    t, k, h = 5, 4, 300
    z = (torch.randn(t * k, h, generator=g) * 2.0 ** torch.randint(-20, 20, (t * k, 1), generator=g)).to(torch.bfloat16)
    w = torch.rand(t, k, generator=g)
    outs = []
    for bh in (TOPK_BLOCK_H, TOPK_WIDE_BLOCK_H):
        out = torch.full((t, h), float("nan"), dtype=torch.bfloat16, device=device)
        K.topk_reduce_kernel[(t, -(-h // bh))](z.to(device), w.to(device), out, h, TOP_K=k, BLOCK_H=bh,
                                               **SEPARATE_ROUNDINGS)
        outs.append(out.cpu())
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16))
    want = torch.zeros(t, h)
    for j in range(k):  # the kernel's order, each product and sum rounded to fp32
        want = want + w[:, j, None] * z.float().view(t, k, h)[:, j]
    assert torch.equal(outs[1], want.to(torch.bfloat16))


def test_inline_tail_blocks_put_each_experts_short_block_after_its_full_ones():
    """inline_tail_blocks on _align's layout of 16-row small blocks (experts of 3, 2, 0 and 1 small blocks, padding
    slots n_pairs, unused blocks expert -1): 32-row blocks of each expert's pairs in order, a short block (its first
    16 slots) where an odd small block is left, then unused blocks; every pair once."""
    from harness.backends.triton_emulation import inline_tail_blocks

    n_pairs, tail = 100, 16
    small = [(0, list(range(0, 16))), (0, list(range(16, 32))), (0, list(range(32, 40)) + [n_pairs] * 8),
             (1, list(range(40, 56))), (1, list(range(56, 60)) + [n_pairs] * 12), (3, list(range(60, 75)) + [n_pairs])]
    small += [(-1, [n_pairs] * 16)] * 4
    sorted_rows = torch.tensor([r for _, rows in small for r in rows], dtype=torch.int32)
    block_expert = torch.tensor([e for e, _ in small], dtype=torch.int32)
    rows, experts, short = inline_tail_blocks(sorted_rows, block_expert, tail, 4, n_pairs)
    rows = rows.view(-1, 2 * tail)
    used = int((experts >= 0).sum())
    assert experts[:used].tolist() == [0, 0, 1, 3] and bool((experts[used:] == -1).all())
    assert short[:used].tolist() == [0, 1, 0, 1] and not bool(short[used:].any())
    assert rows[0].tolist() == list(range(32)) and rows[1].tolist() == list(range(32, 40)) + [n_pairs] * 24
    assert rows[2].tolist() == list(range(40, 60)) + [n_pairs] * 12
    assert rows[3].tolist() == list(range(60, 75)) + [n_pairs] * 17
    assert bool((rows[used:] == n_pairs).all())
    real = rows[rows < n_pairs]
    assert sorted(real.tolist()) == list(range(75))


def _small_prefill_forward(kernel: str, scheme: str, tiles: dict, act: str = "SWIGLUOAI"):
    """(backend, output) of one forward of a small case with biases (3 experts, 50 tokens, top 2; SWIGLUOAI: gate and
    up rows interleaved) on these tiles over 64 columns, 4 warps, 2 stages and the loop's K step."""
    from harness.backends import load_backend
    from harness.core.conformance import Shape, backend_shape, case_checkpoint, case_inputs

    backend = load_backend(kernel).configure(**{**dict(block_n=64, block_k=128 if "bitplace" in kernel else 64,
                                                       num_warps=4, num_stages=2), **tiles})
    shape = backend_shape(backend, Shape(num_experts=3, hidden_size=128, intermediate_size=96, tokens=50, top_k=2))
    ckpt = case_checkpoint(scheme, act, "e4m3fn", shape, seed=9, bias=True)
    x, w, ids = case_inputs(shape, 4)
    return backend, backend.forward(backend.prepare(ckpt), x, w, ids)


def test_the_warp_specialized_bf16_loop_gives_the_same_bits():
    """warp_spec (the bf16 TMA loop warp-specialized by Triton, WARP_SPEC) reads interleaved gate and up rows as row
    pairs (one row of 2 K: gate row n's values, then up row n's) with two MMAs a step: bit for bit the one-box loop's
    outputs, with interleaved rows (SWIGLUOAI) and halves (SILU); an up box read at column k0 instead of K + k0 fails
    it. Under the interpreter the loop runs unspecialized (the schedule is the compiler's: make test's sm90 compile
    check sees the partitions); what this checks is the row-pair addressing. Launches it cannot compile are refused
    by name: activations by pointers (tma 2), quantized weights, a tile or tail below 128 rows (each consumer
    warpgroup's half would be under a wgmma's 64), K not a multiple of block_k with row pairs, a persistent grid, 4 warps at more than 2 stages
    (wrong outputs from Triton 3.6's pipeline on the H200, results/gpu-issue28/run-24)."""
    for act in ("SWIGLUOAI", "SILU"):
        outs = [_small_prefill_forward("triton_emulation", "bf16", dict(block_m=128, tma=1, warp_spec=on), act)[1]
                for on in (0, 1)]
        assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16)), act
        assert outs[0].abs().sum() > 0
    for kernel, scheme, tiles, match in (
            ("triton_emulation", "bf16", dict(block_m=128, tma=2, warp_spec=1), "both operands by TMA"),
            ("triton_emulation", "w_mxfp4", dict(block_m=128, tma=1, warp_spec=1), "dequantizing GEMM"),
            ("triton_bitplace", "w_mxfp4", dict(block_m=64, tma=1, warp_spec=1), "bit-placement GEMM"),
            ("triton_emulation", "bf16", dict(block_m=64, tma=1, warp_spec=1), "block_m"),
            ("triton_emulation", "bf16", dict(block_m=128, tail_m=64, tma=1, warp_spec=1), "tail_m"),
            ("triton_emulation", "bf16", dict(block_m=128, block_k=256, tma=1, warp_spec=1), "multiple of block_k"),
            ("triton_emulation", "bf16", dict(block_m=128, tma=1, warp_spec=1, persistent=1), "plain grid"),
            ("triton_emulation", "bf16", dict(block_m=128, tma=1, warp_spec=1, num_stages=3), "num_stages <= 2"),
            ("triton_emulation", "bf16", dict(block_m=128, tail_m=32, inline_tails=1), "inline_tails takes"),
            ("triton_emulation", "bf16", dict(block_m=32, tail_m=16, tma=1, inline_tails=1), "inline_tails takes")):
        with pytest.raises(ValueError, match=match):
            _small_prefill_forward(kernel, scheme, tiles)
    # a table row's warp_spec_if_fits: warp_spec where both GEMMs compile with it, else the tuned 8-warp row (tma 2)
    from types import SimpleNamespace

    from harness.backends.triton_emulation import TritonEmulationBackend

    row = dict(block_m=128, block_n=128, block_k=64, num_warps=4, tma=1, warp_spec_if_fits=1)
    for hidden, inter, interleaved, tail_m, weight, want in (
            (2880, 2880, True, 0, None, True), (7168, 2048, False, 0, None, True), (160, 96, True, 0, None, False),
            (160, 96, False, 0, None, True), (2880, 2880, True, 64, None, False), (2884, 2880, False, 0, None, False),
            (2880, 2880, True, 0, "MX", False)):
        act = SimpleNamespace(gated=True, interleaved=interleaved)
        prepared = SimpleNamespace(ckpt=SimpleNamespace(num_experts=8, hidden_size=hidden, intermediate_size=inter,
                                                        activation=act, scheme=SimpleNamespace(weight=weight)))
        tiles = TritonEmulationBackend().resolve_tiles({**row, "tail_m": tail_m}, prepared, 4096, "cpu")
        assert "warp_spec_if_fits" not in tiles
        assert (tiles.get("warp_spec"), tiles["num_warps"], tiles["tma"]) == ((1, 4, 1) if want else (None, 8, 2)), \
            (hidden, tiles)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                    reason="the Gluon bf16 kernel issues Hopper's wgmma and TMA: an sm90 GPU only")
@pytest.mark.parametrize("tiles", [dict(block_m=64, tail_m=0, inline_tails=0, persistent=0),
                                   dict(block_m=128, tail_m=0, inline_tails=0, persistent=0), dict(persistent=0), {}],
                         ids=["bm64", "bm128", "bm128-inline", "bm128-inline-persistent"])
@pytest.mark.parametrize("act", ["SWIGLUOAI", "SILU", "SILU_NO_MUL"])
def test_the_gluon_bf16_prefill_kernel_gives_the_bits_of_the_bf16_row(act, tiles):
    """gluon_bf16 (gluon_kernels.bf16_prefill_kernel) against the reference by the conformance bound, and bit for bit
    against the tile table's bf16 prefill row (moe_gemm_kernel: the same operands, K order and epilogue), past the
    fused routing (1200 pairs), with biases, gate and up rows interleaved (row pairs), in halves and ungated (GEMM1
    of 256 outputs a program), GEMM2's K not a multiple of the step (336: TMA's zeros past K; a multiple of 16, as
    the kernel's cp.async runs need), and GEMM1's last program past N_OUT."""
    from harness.backends import backend_structure, load_backend
    from harness.backends.triton_emulation import GLUON_BF16_TILES
    from harness.core.conformance import Shape, backend_shape, compare_backend, reference_run

    gluon = load_backend("triton_emulation").configure(**dict(GLUON_BF16_TILES, **tiles))
    row = load_backend("triton_emulation")
    shape = backend_shape(gluon, Shape(num_experts=8, hidden_size=256, intermediate_size=336, tokens=600, top_k=2))
    ckpt, inputs, out, trace = reference_run("bf16", act, "e4m3fn", shape, 3, backend_structure(gluon))
    result = compare_backend(gluon, ckpt, inputs, out, trace, f"prefill/bf16/gluon_bf16 {tiles}")
    assert result.ok, result.message()
    assert all(gluon.last_compiled[which].name == "bf16_prefill_kernel" for which in ("w13", "w2")), gluon.last_compiled
    x, w, ids = (t.cuda() for t in inputs)
    got = gluon.forward(gluon.prepare(ckpt), x, w, ids)
    want = row.forward(row.prepare(ckpt), x, w, ids)
    assert row.last_compiled["w13"].name == "moe_gemm_kernel"
    assert torch.equal(got.view(torch.int16), want.view(torch.int16)), (got.float() - want.float()).abs().max()


def _tma_box(view: torch.Tensor, row: int, col: int, rows: int, cols: int) -> torch.Tensor:
    """A TMA box of a 2-D tensor: the elements inside it, zeros for the coordinates outside (as TMA fills them)."""
    box = torch.zeros(rows, cols, dtype=view.dtype)
    r0, r1, c0, c1 = max(row, 0), min(row + rows, view.shape[0]), max(col, 0), min(col + cols, view.shape[1])
    if r0 < r1 and c0 < c1:
        box[r0 - row:r1 - row, c0 - col:c1 - col] = view[r0:r1, c0:c1]
    return box


def _replay_bf16_prefill(w, x, n_out: int, gated: bool, interleaved: bool, box=None):
    """bf16_prefill_kernel's addressing replayed in float64 torch (its gluon.jit helpers' Python): for every program
    of every expert and K step, the four weight boxes of the weights' view times the activation rows (zeros past K),
    summed into each consumer warpgroup's two accumulators, stored at the outputs _bf16_first_output names. Returns
    (gate or the ungated sums, up) [E, n_out, tokens]."""
    from harness.backends import gluon_kernels as G

    box = box or G._bf16_box.fn
    e, n_rows, k_dim = w.shape
    pairs = gated and interleaved
    view = (w.reshape(e * n_out, 2 * k_dim) if pairs else w.reshape(e * n_rows, k_dim)).double()
    bk, wide = G.BF16_BLOCK_K, (G.BF16_GATED_OUTPUTS if gated else G.BF16_UNGATED_OUTPUTS).value
    steps = -(-k_dim // bk)
    xs = torch.nn.functional.pad(x.double(), (0, steps * bk - k_dim))
    sums = [torch.full((e, -(-n_out // wide) * wide, x.shape[0]), float("nan"), dtype=torch.float64) for _ in "gu"]
    for expert in range(e):
        w_row = expert * (n_out if pairs else n_rows)
        for g_col0 in range(0, n_out, wide):
            for t in range(2):
                acc = [torch.zeros(64, x.shape[0], dtype=torch.float64) for _ in range(2)]
                for k in range(0, steps * bk, bk):
                    for j in range(2):
                        row, col = box(w_row, g_col0, k, k_dim, n_out, t, j, gated, pairs)
                        acc[j] += _tma_box(view, row, col, 64, bk) @ xs[:, k:k + bk].T
                for j in range(2):
                    first = G._bf16_first_output.fn(g_col0, t, j, gated)
                    sums[j if gated else 0][expert, first:first + 64] = acc[j]
    return sums[0][:, :n_out], sums[1][:, :n_out]


def test_the_gluon_bf16_kernel_s_boxes_replayed_in_torch_give_the_gemm():
    """bf16_prefill_kernel's addressing on the CPU (the kernel runs on sm90 only): its weight boxes (_bf16_box) and the
    outputs each accumulator is stored at (_bf16_first_output), replayed in torch, give x @ W^T for gate and up rows
    interleaved (row pairs of a [E x N, 2 K] view), in halves, and ungated (256 outputs a program), with K and N_OUT
    not multiples of the step and of the program (TMA's zeros past the view's edge; the next expert's rows past
    N_OUT, not stored). An up box read at column k instead of K + k fails it."""
    from harness.backends import gluon_kernels as G

    gen = torch.Generator().manual_seed(5)
    x = torch.randn(5, 192, generator=gen).bfloat16()
    for gated, interleaved, k_dim, n_out in ((True, True, 192, 200), (True, False, 160, 200), (False, False, 160, 300)):
        w = torch.randn(3, 2 * n_out if gated else n_out, k_dim, generator=gen).bfloat16()
        xk = x[:, :k_dim].double()
        if gated and interleaved:
            gate_w, up_w = w[:, 0::2], w[:, 1::2]
        elif gated:
            gate_w, up_w = w[:, :n_out], w[:, n_out:]
        else:
            gate_w, up_w = w, None
        gate, up = _replay_bf16_prefill(w, x[:, :k_dim], n_out, gated, interleaved)
        torch.testing.assert_close(gate, torch.einsum("enk,tk->ent", gate_w.double(), xk), rtol=1e-12, atol=1e-9)
        if gated:
            torch.testing.assert_close(up, torch.einsum("enk,tk->ent", up_w.double(), xk), rtol=1e-12, atol=1e-9)
    # the mutation: row pairs' up box at the gate's columns
    w = torch.randn(3, 400, 192, generator=gen).bfloat16()
    def wrong(w_row, g_col0, k, K, n, t, j, gated, pairs):
        return G._bf16_box.fn(w_row, g_col0, k, 0, n, t, j, gated, pairs)

    _, up = _replay_bf16_prefill(w, x, 200, True, True, box=wrong)
    assert not torch.allclose(up, torch.einsum("enk,tk->ent", w[:, 1::2].double(), x.double()))


def test_the_gluon_bf16_row_takes_bf16_prefill_blocks_and_refuses_what_it_cannot_do(monkeypatch):
    """gluon_bf16's dispatch (triton_emulation._partials_kernel): bf16 weights and activations go to
    launch_bf16_prefill with the GEMM's weights, the tiles' block_m, stages, register cap and group order and the
    epilogue's operands (direct: no partial sums); what the kernel cannot do is refused by name: quantized weights, a
    program's outputs other than 128 gated / 256 ungated, split-K, tails but 64-pair ones inline in 128-pair blocks,
    32-pair blocks, the interpreter; and the
    launch's own refusals (a 32-pair block, interleaved rows with K not whole 64-value steps). The kernel runs on
    sm90 only (test_the_gluon_bf16_prefill_kernel_gives_the_bits_of_the_bf16_row; results/gpu-issue28/run-36)."""
    from harness.backends import gluon_kernels, triton_emulation
    from harness.backends import triton_kernels as K
    from harness.backends.triton_emulation import GLUON_BF16_TILES, TritonEmulationBackend
    from reference.checkpoints import make_checkpoint

    backend = TritonEmulationBackend()
    prep = backend.prepare(make_checkpoint("bf16", "SWIGLUOAI", 2, 256, 128, seed=0, with_bias=True))
    tiles = dict(GLUON_BF16_TILES, tail_m=0, inline_tails=0, persistent=0)
    monkeypatch.setattr(K, "INTERPRET", True)  # (CI's default; on a GPU host too)
    with pytest.raises(ValueError, match="a compiled kernel"):
        backend._partials_kernel(prep, "w13", 0, tiles, None, 128, 256, 256)
    monkeypatch.setattr(K, "INTERPRET", False)
    seen, launch = [], gluon_kernels.launch_bf16_prefill
    monkeypatch.setattr(gluon_kernels, "launch_bf16_prefill", lambda *args: seen.append(args))
    run = backend._partials_kernel(prep, "w13", 0, tiles, None, 128, 256, 256)
    assert run.direct
    a = torch.zeros(2, 256, dtype=torch.bfloat16)
    run(a, None, "rows", "experts", 4, 2, 128, 256, 256, True, 1, direct=dict(final_ptr="the output"))
    launcher, w, a_arg, rows, experts, n_pairs, a_row_div, n_out, n_rows, k_dim, gated, interleaved, direct, \
        stages, bm, maxnreg, group_m, persistent, short = seen[-1]
    assert launcher is K.bf16_prefill_kernel and w is prep.w13 and a_arg is a and (rows, experts) == ("rows", "experts")
    assert (n_pairs, a_row_div, n_out, n_rows, k_dim, gated, interleaved) == (4, 2, 128, 256, 256, True, True)
    assert direct == dict(final_ptr="the output") and (stages, bm, maxnreg, group_m, persistent, short) == \
        (4, 128, 168, 8, 0, None)
    # the table's row: persistent, one program a multiprocessor (compile_check's stand-in: the H200's 132), the short
    # blocks' flags passed on (inline tails)
    run = backend._partials_kernel(prep, "w13", 0, GLUON_BF16_TILES, None, 128, 256, 256)
    assert run.direct and run.inline_tails
    run(a, None, "rows", "experts", 4, 2, 128, 256, 256, True, 1, direct={}, block_short="flags")
    assert seen[-1][-2:] == (132, "flags")
    assert backend._partials_kernel(prep, "w2", 0, tiles, None, 256, 256, 128).direct  # GEMM2: 256 outputs
    mx = backend.prepare(make_checkpoint("w_mxfp4", "SWIGLUOAI", 2, 256, 128, seed=0, with_bias=True))
    for which, other, ckpt_prep, match in (
            ("w13", tiles, mx, "bf16 weights"), ("w13", dict(tiles, block_n=64), prep, "128 outputs"),
            ("w2", dict(tiles, w2_block_n=128), prep, "256 outputs"), ("w13", dict(tiles, split_k=2), prep, "split_k"),
            ("w13", dict(tiles, tail_m=64), prep, "tails inline"), ("w13", dict(tiles, block_m=32), prep, "block_m 64"),
            ("w13", dict(tiles, block_m=64, tail_m=32, inline_tails=1), prep, "tails inline")):
        with pytest.raises(ValueError, match=match):
            backend._partials_kernel(ckpt_prep, which, 0, other, None, 128, 256, 256)
    with pytest.raises(ValueError, match="K a multiple of 16"):
        backend._partials_kernel(prep, "w13", 0, tiles, None, 128, 256, 264)
    w = torch.zeros(2, 256, 96, dtype=torch.bfloat16)
    # (K 72: 16-byte cp.async runs at offsets Triton cannot prove aligned, refused with halves too; K 96 interleaved)
    for bm, k_dim, interleaved, match in ((32, 64, True, "bm"), (64, 96, True, "multiple of 16"),
                                          (64, 72, False, "multiple of 16")):
        with pytest.raises(ValueError, match=match):
            launch(None, w[..., :k_dim].contiguous(), None, None, None, 4, 2, 128, 256, k_dim, True, interleaved, {},
                   4, bm, 168)
    with pytest.raises(ValueError, match="65536"):  # 176 registers x 384 threads: more than a multiprocessor holds
        launch(None, w[..., :64].contiguous(), None, None, None, 4, 2, 128, 256, 64, True, True, {}, 4, 64, 176)
    # the kernel's outputs a program whatever the tiles said: 128 gated, 256 ungated (GEMM2, and GEMM1 of an ungated
    # activation)
    for act, want in (("SWIGLUOAI", 128), ("SILU_NO_MUL", 256)):
        ungated = backend.prepare(make_checkpoint("bf16", act, 2, 256, 128, seed=0, with_bias=False))
        resolved = backend.resolve_tiles(dict(tiles, block_n=64, w2_block_n=64), ungated, 8192, "cpu")
        assert (resolved["block_n"], resolved["w2_block_n"]) == (want, 256), resolved
    # the table's bf16 prefill row only with the switch (MOE_CONFORMANCE_GLUON_BF16=1)
    assert (backend.tile_config(8192, None) == GLUON_BF16_TILES) == triton_emulation.GLUON_BF16_PREFILL


def test_a_persistent_grid_gives_the_same_bits(monkeypatch):
    """persistent (moe_gemm_kernel's PERSISTENT): a few programs each computing the used blocks' tiles in turn (their
    count read on the device) give bit for bit the plain grid's outputs, on the dequantizing loop (bf16, MXFP4
    weights), the bit-placement loop (NVFP4 W4A4, GEMM1's epilogue quantizing), bf16 weights by TMA, in grouped tile
    order and with tail blocks (a second work list); two programs on a one-multiprocessor GPU, so that each runs many
    tiles."""
    from harness.backends import triton_emulation

    monkeypatch.setattr(triton_emulation, "H200_MULTIPROCESSORS", 1)
    for kernel, scheme, more in (("triton_emulation", "bf16", {}), ("triton_emulation", "w_mxfp4", dict(group_m=2)),
                                 ("triton_bitplace", "w_nvfp4_a_nvfp4", dict(block_m=32, tail_m=16)),
                                 ("triton_emulation", "bf16", dict(tma=2, group_m=2))):
        outs = []
        for persistent in (0, 2):
            backend, out = _small_prefill_forward(kernel, scheme, {"block_m": 16, **more, "persistent": persistent})
            outs.append(out)
        assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16)), (kernel, scheme, more)
        assert outs[0].abs().sum() > 0
        assert backend.last_launch["w13"][0] == (2,), backend.last_launch["w13"]


def test_launch_parameters_that_cannot_work_are_refused_by_name():
    """tail_m that does not divide block_m, tail_m with split-K (its epilogue runs over every pair of the GEMM, half
    of them the other launch's), and TMA activations in the bit-placement loop at 128 rows (wrong outputs on the H200,
    results/gpu-issue28/run-17): a ValueError naming the parameter, never a launch."""
    from harness.backends import load_backend
    from harness.core.conformance import Shape, backend_shape, case_checkpoint, case_inputs

    for kernel, tiles, match in (("triton_emulation", dict(block_m=32, tail_m=24), "tail_m must"),
                                 ("triton_emulation", dict(block_m=32, tail_m=32), "tail_m must"),
                                 ("triton_bitplace", dict(block_m=32, tail_m=16, split_k=2), "tail_m 16"),
                                 ("triton_bitplace", dict(block_m=128, tma=1), "tma 1 with the bit-placement loop")):
        backend = load_backend(kernel).configure(block_n=64, block_k=128, num_warps=4, num_stages=2, **tiles)
        shape = backend_shape(backend, Shape(num_experts=3, hidden_size=128, intermediate_size=96, tokens=20, top_k=2))
        ckpt = case_checkpoint("w_mxfp4", "SILU", "e4m3fn", shape, seed=1, bias=False)
        x, w, ids = case_inputs(shape, 2)
        with pytest.raises(ValueError, match=match):
            backend.forward(backend.prepare(ckpt), x, w, ids)
