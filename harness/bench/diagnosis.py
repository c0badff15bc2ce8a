"""Why a benchmark case runs at the speed it does, measured in the same run (issue 15: a missed target reports
what was measured, not a guess): for the Triton backends, the compiled GEMM kernels' registers, shared memory,
occupancy (programs resident per multiprocessor and what limits them) and waves; for every backend, the device
time of its kernels in one profiled forward, the GEMMs apart from the rest (routing, quantizers, reductions).

and the K loop's warp-instructions per weight byte (the SASS of the compiled kernel, disassembled with the
nvdisasm that Triton bundles; the budget at the H200's copy rate is ~0.245, ../shared/PERF.md).

`occupancy`, `weight_bytes_per_iteration` and `k_loop` are plain arithmetic and text (checked on the CPU);
`kernel_facts` and `kernel_time_split` need a GPU; `sass` needs a cubin (tools/count_loop_instructions.py
compiles one for sm90 without a GPU)."""

from __future__ import annotations

import math
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SMLimits", "HOPPER", "GEMM_KERNEL_WORDS", "INSTRUCTION_BUDGET", "occupancy", "kernel_facts", "kernel_table",
           "kernel_time_split", "sass", "k_loop", "weight_bytes_per_iteration", "loop_facts", "describe"]

INSTRUCTION_BUDGET = 0.245  # warp-instructions per weight byte at the H200's copy rate, full issue efficiency


@dataclass(frozen=True)
class SMLimits:
    """One multiprocessor's budgets (the CUDA occupancy calculator's numbers)."""
    registers: int = 65536
    shared_bytes: int = 233472  # 228 KB
    reserved_shared_per_block: int = 1024
    max_warps: int = 64
    max_blocks: int = 32
    register_unit: int = 256  # registers are allocated per warp in units of 256 (8 per thread)


HOPPER = SMLimits()  # sm90 (H100, H200)


def occupancy(regs_per_thread: int, shared_bytes: int, warps: int, limits: SMLimits = HOPPER) -> dict:
    """Programs (thread blocks) of this kernel resident per multiprocessor, and which budget sets that number."""
    warp_regs = math.ceil(regs_per_thread * 32 / limits.register_unit) * limits.register_unit
    by = dict(registers=(limits.registers // warp_regs) // warps if warp_regs else limits.max_blocks,
              shared_memory=limits.shared_bytes // (shared_bytes + limits.reserved_shared_per_block),
              warps=limits.max_warps // warps, blocks=limits.max_blocks)
    programs = min(by.values())
    return dict(programs_per_sm=programs, warps_per_sm=programs * warps,
                limited_by="+".join(k for k, v in by.items() if v == programs))


def kernel_facts(compiled, programs: int, sms: int, limits: SMLimits = HOPPER) -> dict:
    """A compiled Triton kernel (what a launch returns) and the programs its launch ran: registers, spills (Triton's
    n_spills: local memory bytes / 4), shared memory, occupancy and waves (programs / (SMs x resident programs))."""
    warps = compiled.metadata.num_warps
    occ = occupancy(compiled.n_regs, compiled.metadata.shared, warps, limits)
    return dict(regs=compiled.n_regs, spills=compiled.n_spills, shared_kb=compiled.metadata.shared / 1024,
                warps=warps, programs=programs, waves=programs / max(1, sms * occ["programs_per_sm"]), **occ)


def _nvdisasm() -> str:
    import triton

    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm")


def sass(cubin: bytes) -> tuple[list[tuple[int, str]], dict[str, int]]:
    """(address, instruction) of every SASS instruction of a cubin, and each label's address."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([_nvdisasm(), "-c", f.name], capture_output=True, text=True, check=True).stdout
    out, labels, pending = [], {}, []
    for line in text.splitlines():
        label = re.match(r"\s*(\.L_x_\d+):", line)
        if label:
            pending.append(label.group(1))
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m:
            addr = int(m.group(1), 16)
            labels.update({name: addr for name in pending})
            pending = []
            out.append((addr, m.group(2).strip()))
    return out, labels


def k_loop(instructions: list[tuple[int, str]], labels: dict[str, int]) -> list[str]:
    """The innermost backward-branch loop that holds tensor-core instructions (HGMMA / HMMA) and no global store
    (a warp-specialised kernel's partition loop holds a K step and the epilogue: not the K loop)."""
    best = None
    for addr, ins in instructions:
        m = re.search(r"\bBRA\b.*?(\.L_x_\d+)", ins)
        if not m or m.group(1) not in labels or labels[m.group(1)] > addr:
            continue
        body = [s for a, s in instructions if labels[m.group(1)] <= a <= addr]
        if (any(re.search(r"\b(HGMMA|HMMA)\.", s) for s in body) and not any(re.search(r"\bSTG\.", s) for s in body)
                and (best is None or len(body) < len(best))):
            best = body
    if best is None:
        raise RuntimeError("no loop with tensor-core instructions found in the SASS")
    return best


def weight_bytes_per_iteration(scheme: str, block_n: int, block_k: int, gated: bool) -> int:
    """Codes and block scales of the weight tile(s) one K step reads (gate and up tiles for a gated GEMM1)."""
    if scheme == "bf16":
        per = block_n * block_k * 2
    elif scheme.startswith("w_mxfp4"):
        per = block_n * block_k // 2 + block_n * block_k // 32
    elif scheme.startswith("w_nvfp4"):
        per = block_n * block_k // 2 + block_n * block_k // 16
    else:
        raise ValueError(f"no byte count per K step for {scheme}")
    return (2 if gated else 1) * per


def issue_over_mma(loop_instructions: int, num_warps: int, block_m: int, weight_rows: int, block_k: int,
                   fp8: bool = False) -> float:
    """A K step's issue time over its MMA time on one multiprocessor: its warp-instructions at 4 a clock (one a
    scheduler) against block_m x weight_rows x block_k bf16 multiply-adds at 2048 a clock (the H200's dense bf16
    rate: ~989 TFLOP/s = 132 multiprocessors x 1.83 GHz x 4096 FLOP). Programs sharing a multiprocessor share both
    its schedulers and its tensor cores, so the ratio is the multiprocessor's too: above 1 the K loop's issue, not
    the tensor cores, bounds a compute-bound GEMM (prefill). fp8: FP8 MMAs, twice the rate."""
    return (loop_instructions * num_warps / 4) / (block_m * weight_rows * block_k / (4096 if fp8 else 2048))


def loop_facts(cubin: bytes, scheme: str, tiles: dict, gated: bool) -> dict:
    """The K loop's SASS instructions, warp-instructions per weight byte (x num_warps / bytes per step) and issue
    time over MMA time (issue_over_mma)."""
    loop = k_loop(*sass(cubin))
    nbytes = weight_bytes_per_iteration(scheme, tiles["block_n"], tiles["block_k"], gated)
    return dict(loop_instructions=len(loop), warp_instructions_per_byte=len(loop) * tiles["num_warps"] / nbytes,
                issue_over_mma=issue_over_mma(len(loop), tiles["num_warps"], tiles["block_m"],
                                              tiles["block_n"] * (2 if gated else 1), tiles["block_k"],
                                              fp8=any(re.search(r"HGMMA\S*\.E[45]M", i) for i in loop)))


# kernel names of MoE GEMMs: ours (and its split-K epilogue; the Gluon decode GEMM writes fp32 partials, named so),
# CUTLASS, cuBLAS(Lt)'s nvjet kernels on Hopper, XLA
GEMM_KERNEL_WORDS = ("gemm", "splitk", "bitplace_partials", "cutlass", "matmul", "nvjet", "ragged_dot")


def kernel_table(fn, setup=None) -> list[tuple[str, int, float]]:
    """(kernel name, launches, device us) of the kernels one call of fn launches, from the profiler, slowest
    first. Eager, not a graph replay: the kernels are the same, the launch gaps are not counted. setup (the L2
    flush the timed rounds make) runs first, outside the profile."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    if setup is not None:
        setup()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    rows = []
    for event in prof.key_averages():
        t = getattr(event, "device_time_total", None)
        t = getattr(event, "cuda_time_total", 0.0) if t is None else t
        if not t or getattr(event, "device_type", None) is not None and "CUDA" not in str(event.device_type):
            continue
        rows.append((event.key, int(event.count), float(t)))
    return sorted(rows, key=lambda r: -r[2])


def kernel_time_split(fn, setup=None) -> dict:
    """Device time (us) of one call of fn's kernels (kernel_table): the GEMMs (a name holding one of
    GEMM_KERNEL_WORDS) apart from the rest."""
    gemm = other = 0.0
    for name, _, t in kernel_table(fn, setup):
        if any(word in name.lower() for word in GEMM_KERNEL_WORDS):
            gemm += t
        else:
            other += t
    return dict(gemm_kernels_us=gemm, other_kernels_us=other)


def describe(row: dict) -> str:
    """One line of what the row measured beyond its time (for targets.md's misses); '' when nothing was."""
    parts = []
    if "gemm_kernels_us" in row:
        parts.append(f"GEMM kernels {row['gemm_kernels_us']:.0f} us + other kernels {row['other_kernels_us']:.0f} us "
                     f"of {row['us']:.0f} us")
    g1 = row.get("gemm1")
    if g1:
        parts.append(f"GEMM1 {g1['regs']} regs, {g1['shared_kb']:.1f} KB shared, {g1['programs_per_sm']} programs/SM "
                     f"({g1['limited_by']}), {g1['waves']:.1f} waves")
        if "warp_instructions_per_byte" in g1:
            parts.append(f"K loop {g1['loop_instructions']} SASS = {g1['warp_instructions_per_byte']:.3f} "
                         f"warp-instr/weight byte (budget {INSTRUCTION_BUDGET})")
        if "issue_over_mma" in g1 and "pct_dense_sustained" in row:  # judged by the tensor cores' rate
            parts.append(f"K step issue / MMA time {g1['issue_over_mma']:.2f}")
    if "weight_bytes" in row:
        parts.append(f"{row['weight_bytes'] / 1e6:.0f} MB of weights")
    if "pct_dense_sustained" in row and "pct_copy" in row:
        # a row judged by the tensor cores' rate still streams every expert's weights once: at the copy rate that alone
        # takes pct_copy % of the row's time (Kimi-K2's bf16 prefill, 33.8 GB of weights, is near that floor on an H100)
        parts.append(f"weights streamed at {row['tb_s']:.2f} TB/s = {row['pct_copy']:.0f}% of copy (the weight stream "
                     f"alone at the copy rate: {row['pct_copy']:.0f}% of the row's time)")
    if "pct_dense_sustained" in row:
        parts.append(f"the row {row['pct_dense_cold']:.1f}% of the dense bf16 matmul cold ({row['dense_cold_tflops']:.0f}"
                     f" TFLOP/s), {row['pct_dense_sustained']:.1f}% of it sustained "
                     f"({row['dense_sustained_tflops']:.0f} TFLOP/s)")
    if row.get("diagnosis_error"):
        parts.append(f"diagnosis failed: {row['diagnosis_error']}")
    return "; ".join(parts)
