"""Platforms as data, and the one place that detects which one this machine is.

A platform is what must hold there: its FP8 dtype, the formats its hardware runs natively, and the
oracle's backend priority list (ending in an emulation backend, so every scheme x activation resolves).
Semantics (FP8 dtype, priorities) are simulated anywhere; hardware is detected here and nowhere else.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from reference.formats import E4M3FN, E4M3FNUZ, FloatFormat

__all__ = ["Platform", "PLATFORMS", "platform_by_name", "detect_platform", "HostInfo", "host_info", "has_gpu",
           "default_device", "matrix_unit_truncation"]


@dataclass(frozen=True)
class Platform:
    name: str
    vendor: str  # "cpu", "nvidia", "amd"
    description: str
    fp8_format: FloatFormat
    native_formats: frozenset[str]  # what the hardware's matrix units take natively
    backend_priority: tuple[str, ...]  # the oracle's order; the last is an emulation backend
    # what the matrix units' FP8 accumulation may add to fp32's error, relative to sum|a||w| (a GEMM's declared
    # accumulation_error on FP8 operands); 0 where measured exact-fp32 or not measured (then say so)
    fp8_mma_accumulation_error: float = 0.0
    # what the matrix units' bf16 accumulation may lose toward zero at each 16-wide K step, relative to the running
    # sum (a backend on them declares it as accumulation_truncation); 0 where round-to-nearest or not measured
    mma_truncation: float = 0.0

    @property
    def runner_labels(self) -> tuple[str, ...]:
        """Self-hosted CI runner labels of a machine of this platform (the nightly matrix uses them)."""
        return ("self-hosted", "linux", self.vendor, self.name) if self.is_gpu else ("ubuntu-latest",)

    @property
    def fp8_dtype(self) -> torch.dtype:
        return {E4M3FN: torch.float8_e4m3fn, E4M3FNUZ: torch.float8_e4m3fnuz}[self.fp8_format]

    @property
    def is_gpu(self) -> bool:
        return self.vendor != "cpu"


_EMULATION_TAIL = ("triton_emulation", "torch_emulation")

PLATFORMS: dict[str, Platform] = {
    p.name: p
    for p in (
        Platform("cpu", "cpu", "CPU: Triton kernels under the interpreter (TRITON_INTERPRET=1)", E4M3FN,
                 frozenset(), _EMULATION_TAIL),
        # Hopper's FP8 tensor cores do not accumulate in full fp32 between promotions: measured on the H200
        # (tools/probe_fp8_accumulation.py, results/gpu-issue6) max |error| / sum|a||w| = 1.7e-4 at K=128 and at
        # most 2.7e-4 for K up to 8192 with or without fast accumulation, about K-independent (a narrow adder per
        # k-chunk, promoted to fp32). But the nightly search found torch._scaled_mm past 2^-11 = 4.9e-4: at K = 128
        # a GEMM1 output crossed a bf16 midpoint 5.1e-4 (or 5.2e-4: gate or up) of sum|a||w| away, flipping an a2
        # code (results/gpu-issue25/run-5: shape class tokens_past_256_mixtral-8x7b, seed 2). 2^-10 = 9.8e-4,
        # about twice that, also covers a chunk sum truncated to 11 significand bits (harness.backends.emulation's
        # narrow_accumulator, tested on CPU). vLLM's Triton FP8 tl.dot shows it too (results/gpu-issue23/run-7:
        # 41-410 of 32768 elements 2.5-8x past an fp32-accumulation bound).
        # Its bf16 matrix units (Triton's tl.dot, results/gpu-issue24/run-3/mma-accumulation.md) lose toward zero:
        # over all-positive terms the error grows like K (0.044-0.072 u K sum|x| at K = 512-7168, where fp32 SGEMM
        # stays at 0.001-0.006), 2.3 u of the running sum per 16-wide step at most; 2^-21 = 8 u per step covers it
        # with room for steps where the running sum dwarfs the products more than in that probe.
        Platform("sm90", "nvidia", "NVIDIA Hopper (H100/H200): FP8 native, FP4/FP6 emulated", E4M3FN,
                 frozenset({"fp8"}), ("torch_fp8", "triton_dot_scaled", *_EMULATION_TAIL), 2.0**-10,
                 mma_truncation=2.0**-21),
        Platform("sm100", "nvidia", "NVIDIA Blackwell (B200): native MXFP8/MXFP4/NVFP4 and FP8", E4M3FN,
                 frozenset({"fp8", "mxfp8", "mxfp4", "nvfp4"}),
                 ("torch_blockscaled", "torch_fp8", "triton_dot_scaled", *_EMULATION_TAIL)),
        Platform("gfx942", "amd", "AMD MI300 (gfx942): E4M3FNUZ FP8, no FP4/FP6", E4M3FNUZ,
                 frozenset({"fp8"}), ("aiter", "torch_fp8", *_EMULATION_TAIL)),
        Platform("gfx950", "amd", "AMD MI350 (gfx950): OCP FP8, native MXFP4/MXFP6", E4M3FN,
                 frozenset({"fp8", "mxfp4", "mxfp6"}), ("aiter", "triton_dot_scaled", "torch_fp8", *_EMULATION_TAIL)),
    )
}


def platform_by_name(name: str) -> Platform:
    try:
        return PLATFORMS[name]
    except KeyError:
        raise ValueError(f"unknown platform {name!r}; expected one of {sorted(PLATFORMS)}") from None


@dataclass(frozen=True)
class HostInfo:
    platform: Platform
    device_name: str
    torch_version: str
    triton_version: str | None


def _detect() -> tuple[Platform, str]:
    if not torch.cuda.is_available():
        return PLATFORMS["cpu"], "cpu"
    props = torch.cuda.get_device_properties(0)
    if torch.version.hip:
        arch = getattr(props, "gcnArchName", "").split(":")[0]
        if arch in PLATFORMS:
            return PLATFORMS[arch], props.name
        raise RuntimeError(f"AMD GPU {props.name} ({arch}) is not a platform this harness models: {sorted(PLATFORMS)}")
    major, minor = torch.cuda.get_device_capability(0)
    name = {9: "sm90", 10: "sm100"}.get(major)
    if name is None:
        raise RuntimeError(f"NVIDIA GPU {props.name} (sm{major}{minor}) is not a platform this harness models")
    return PLATFORMS[name], props.name


@functools.lru_cache(maxsize=1)
def host_info() -> HostInfo:
    platform, device = _detect()
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:  # pragma: no cover - triton is a dependency
        triton_version = None
    return HostInfo(platform, device, torch.__version__, triton_version)


def triton_version() -> tuple[int, int]:
    """The installed Triton's (major, minor): a tile that one Triton release compiles well and another does not is
    chosen here, in one place (harness.backends.triton_bitplace.EIGHT_WARP_BITPLACE_TRITON)."""
    import triton

    major, minor = triton.__version__.split(".")[:2]
    return int(major), int(minor)


def detect_platform() -> Platform:
    """The platform this machine is (cpu when no GPU is visible)."""
    return host_info().platform


def has_gpu() -> bool:
    """A GPU torch can use is visible (the one hardware probe every other module asks)."""
    return torch.cuda.is_available()


def default_device() -> str:
    """Where backends put their tensors by default: "cuda" when a GPU is visible, else "cpu"."""
    return "cuda" if has_gpu() else "cpu"


def matrix_unit_truncation(device) -> float:
    """accumulation_truncation for a kernel whose bf16 GEMMs run on this machine's matrix units on `device` (0 on the
    CPU, where they are emulated with round-to-nearest fp32 sums)."""
    return 0.0 if str(device) == "cpu" else detect_platform().mma_truncation


def gpu_count() -> int:
    return torch.cuda.device_count() if has_gpu() else 0


def pin_worker_to_gpu(worker: str | None) -> int | None:
    """On a machine with several GPUs, pytest-xdist worker gwN uses GPU N mod count ("cuda" then means it):
    conformance cases spread over the GPUs. Returns the GPU index, or None (no xdist worker, one GPU or none)."""
    n = gpu_count()
    if not worker or n < 2 or not worker.startswith("gw") or not worker[2:].isdigit():
        return None
    index = int(worker[2:]) % n
    torch.cuda.set_device(index)
    return index
