"""Why a benchmark case runs at the speed it does, measured in the same run (issue 15: a missed target reports
what was measured, not a guess): for the Triton backends, the compiled GEMM kernels' registers, shared memory,
occupancy (programs resident per multiprocessor and what limits them) and waves; for every backend, the device
time of its kernels in one profiled forward, the GEMMs apart from the rest (routing, quantizers, reductions).

`occupancy` is plain arithmetic (checked on the CPU); `kernel_facts` and `kernel_time_split` need a GPU."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["SMLimits", "HOPPER", "GEMM_KERNEL_WORDS", "occupancy", "kernel_facts", "kernel_time_split", "describe"]


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


# kernel names of MoE GEMMs: ours (and its split-K epilogue), CUTLASS, cuBLAS(Lt)'s nvjet kernels on Hopper, XLA
GEMM_KERNEL_WORDS = ("gemm", "splitk", "cutlass", "matmul", "nvjet", "ragged_dot")


def kernel_time_split(fn, setup=None) -> dict:
    """Device time (us) of the kernels one call of fn launches, from the profiler: the GEMMs (a name holding one
    of GEMM_KERNEL_WORDS) apart from the rest. Eager, not a graph replay: the kernels are the same, the launch
    gaps are not counted. setup (the L2 flush the timed rounds make) runs first, outside the profile."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    if setup is not None:
        setup()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    gemm = other = 0.0
    for event in prof.key_averages():
        t = getattr(event, "device_time_total", None)
        t = getattr(event, "cuda_time_total", 0.0) if t is None else t
        if not t or getattr(event, "device_type", None) is not None and "CUDA" not in str(event.device_type):
            continue
        if any(word in event.key.lower() for word in GEMM_KERNEL_WORDS):
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
    if "weight_bytes" in row:
        parts.append(f"{row['weight_bytes'] / 1e6:.0f} MB of weights")
    if row.get("diagnosis_error"):
        parts.append(f"diagnosis failed: {row['diagnosis_error']}")
    return "; ".join(parts)
