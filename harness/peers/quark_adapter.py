"""AMD Quark (the tool that writes OCP MX checkpoints; vLLM's Quark MXFP4 path calls quark.torch.kernel.mx) as a
peer: its pure-torch MX quantizer and dequantizer (quark.torch.kernel.mx.triton's downcast_to_mxfp_torch and
upcast_from_mxfp_torch, the torch twins of its Triton kernels) and its EVEN shared-scale rule
(quark.torch.quantization.utils.even_round), run on the CPU and returned in the reference's logical layout (one uint8
code per element, uint8 E8M0 scale codes). Optional: the `quark` extra.

What does not run here: quark.torch.kernel.mx.qdq_mxfp4 / dq_mxfp4 (what vLLM calls) dispatch to a HIP kernel
(QUARK_MXFP4_IMPL=hip, the default; its sources are .cu only) or to Triton GPU kernels: no CPU path. Quark's MX
fake quantizer fake_quantize_mx (FP4, FP6 E2M3 / E3M2; floor / ceil / even) does run, through
torch.ops.quark.fake_quantize_to_low_precision_fp, a C++ extension that Quark JIT-builds for the CPU with ninja + g++
on first use (~5 s on 2 cores), then cached in the harness's own folder (quark_extensions_dir: not torch's shared
~/.cache/torch_extensions, see _sole_extension_builder for why).

`import quark.torch` takes ~26 s (its __init__ pulls in the model quantizer, exporters and the MoE expert
replacements), so the two source modules are imported under empty package stand-ins for quark.torch,
quark.torch.kernel, quark.torch.kernel.mx, quark.torch.kernel.hw_emulation and quark.torch.quantization (each with
its real __path__, so every submodule still imports from Quark's own files; only those packages' __init__ code is
skipped). The stand-ins are installed only where the real package is not already imported, and they stay (the EVEN
path of downcast_to_mxfp_torch imports even_round at call time). ~2.5-4 s instead of ~26 s."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import sys
import types
from pathlib import Path

import torch

from harness.peers import installed

from reference.formats import E2M1, E2M3, E3M2, E4M3FN, E5M2, FloatFormat
from reference.packing import pack_fp4, unpack_fp4

__all__ = ["quark_available", "QUARK_SCALE_MODES", "QUARK_ELEMENT_FORMATS", "quark_quantize_mx",
           "quark_dequantize_mx", "quark_qdq_mx", "quark_even_exponent", "QUARK_FAKE_SCALE_MODES",
           "QUARK_FAKE_ELEMENT_FORMATS", "quark_fake_quantize_mx", "quark_extensions_dir"]

# Quark's DequantScaleRoundingMode names (downcast_to_mxfp_torch); EVEN is MXFP4 only there
QUARK_SCALE_MODES = ("ROUND_UP", "ROUND_DOWN", "EVEN")
# the element formats the torch twins take, as the out_quant_type / stored dtype they use
_TORCH_DTYPE = {E2M1: torch.uint8, E4M3FN: torch.float8_e4m3fn, E5M2: torch.float8_e5m2}
QUARK_ELEMENT_FORMATS = tuple(_TORCH_DTYPE)
# Quark's Dtype names for even_round / get_dtype_params
_QUARK_DTYPE_NAME = {E2M1: "fp4", E2M3: "fp6_e2m3", E3M2: "fp6_e3m2", E4M3FN: "fp8_e4m3", E5M2: "fp8_e5m2"}

_STANDINS = ("quark.torch", "quark.torch.kernel", "quark.torch.kernel.mx", "quark.torch.kernel.hw_emulation",
             "quark.torch.quantization")
# fake_quantize_mx's scale_calculation_mode values
QUARK_FAKE_SCALE_MODES = ("floor", "ceil", "even")
# the element formats fake_quantize_mx is checked for here (its FP8 elements go through other kernels)
QUARK_FAKE_ELEMENT_FORMATS = (E2M1, E2M3, E3M2)


def quark_available() -> tuple[bool, str]:
    """Is amd-quark installed (found, not imported: `import quark.torch` takes ~26 s)."""
    return installed("amd-quark", "quark")


def _install_standins() -> None:
    import quark

    root = quark.__path__[0]
    for name in _STANDINS:
        if name in sys.modules:
            continue
        m = types.ModuleType(name)
        m.__path__ = [root + "/" + name[len("quark."):].replace(".", "/")]
        m.__package__ = name
        sys.modules[name] = m
    # quark.torch.utils is the real package: hw_emulation_interface imports names from its __init__, and that
    # __init__ must run before quark.torch.quantization.utils (they import each other)
    import quark.torch.utils  # noqa: F401


@functools.cache
def _mx_module():
    _install_standins()
    from quark.torch.kernel.mx import triton as mx_torch

    return mx_torch


def quark_extensions_dir() -> Path:
    """Where the harness has torch build Quark's C++ extension: a folder of its own under the user's cache
    ($XDG_CACHE_HOME or ~/.cache), one per Python and torch build, so that no other program builds there."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    tag = f"py{sys.version_info.major}{sys.version_info.minor}-torch{torch.__version__}"
    return Path(cache) / "moe-conformance" / "torch_extensions" / tag


@contextlib.contextmanager
def _sole_extension_builder(root: Path):
    """Holds TORCH_EXTENSIONS_DIR at root, as the only harness process loading an extension there.

    torch.utils.cpp_extension guards a build with a lock *file* (FileBaton, `<root>/<name>/lock`), which a builder
    that dies mid-build (a test timeout's os._exit, Ctrl-C, a cancelled CI job) leaves behind; every later load then
    polls for it forever. Two CI runs stalled that way at the first fake_quantize_mx test, 300 s a test, from a lock
    left in ~/.cache/torch_extensions by a killed run. An flock on `<root>/.harness-lock` is dropped by the kernel
    when its holder dies, so whoever holds it is the only live builder under root (the harness's own folder):
    any torch lock file found then is stale, and is removed."""
    root.mkdir(parents=True, exist_ok=True)
    before = os.environ.get("TORCH_EXTENSIONS_DIR")
    with open(root / ".harness-lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        try:
            for stale in root.glob("*/lock"):
                stale.unlink(missing_ok=True)
            os.environ["TORCH_EXTENSIONS_DIR"] = str(root)
            yield
        finally:
            if before is None:
                os.environ.pop("TORCH_EXTENSIONS_DIR", None)
            else:
                os.environ["TORCH_EXTENSIONS_DIR"] = before
            fcntl.flock(held, fcntl.LOCK_UN)


@functools.cache
def _hw_module():
    """hw_emulation_interface: importing it loads Quark's stable-ABI C++ extension (which backs
    torch.ops.quark.fake_quantize_to_low_precision_fp), JIT-building it on first use (~5 s on 2 cores) in
    quark_extensions_dir()."""
    _install_standins()
    with _sole_extension_builder(quark_extensions_dir()):
        from quark.torch.kernel.hw_emulation import hw_emulation_interface

    return hw_emulation_interface


@functools.cache
def _utils_module():
    _install_standins()
    from quark.torch.quantization import utils

    return utils


def _check_elem(elem: FloatFormat) -> None:
    if elem not in _TORCH_DTYPE:
        raise ValueError(f"Quark's torch MX path takes {[f.name for f in QUARK_ELEMENT_FORMATS]}, got {elem!r}")


def quark_quantize_mx(x: torch.Tensor, elem: FloatFormat, mode: str = "EVEN") -> tuple[torch.Tensor, torch.Tensor]:
    """(element codes uint8 [x's shape], E8M0 scale codes uint8 [..., K/32]) from downcast_to_mxfp_torch(x, ...,
    axis=-1, DEQUANT_SCALE_ROUNDING_MODE=mode): blocks of 32 along the last axis, FP4 codes unpacked from Quark's
    two-per-byte layout (low nibble first)."""
    _check_elem(elem)
    mx = _mx_module()
    q, s = mx.downcast_to_mxfp_torch(x, _TORCH_DTYPE[elem], axis=-1,
                                     DEQUANT_SCALE_ROUNDING_MODE=mx.DequantScaleRoundingMode[mode])
    codes = unpack_fp4(q) if elem is E2M1 else q.view(torch.uint8)
    return codes.reshape(x.shape), s


def quark_dequantize_mx(codes: torch.Tensor, scales: torch.Tensor, elem: FloatFormat,
                        dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """upcast_from_mxfp_torch of the reference's logical layout (FP4 codes packed two per byte, low nibble first,
    as Quark packs; FP8 codes viewed as the float8 dtype), blocks of 32 along the last axis."""
    _check_elem(elem)
    q = pack_fp4(codes) if elem is E2M1 else codes.view(_TORCH_DTYPE[elem])
    return _mx_module().upcast_from_mxfp_torch(q, scales, dtype, axis=-1)


def quark_qdq_mx(x: torch.Tensor, elem: FloatFormat, mode: str = "EVEN") -> torch.Tensor:
    """Quantize then dequantize through the torch twins: what qdq_mxfp4 (vLLM's call) computes on a GPU, with
    downcast_to_mxfp / upcast_from_mxfp, for MXFP4 with EVEN."""
    _check_elem(elem)
    mx = _mx_module()
    q, s = mx.downcast_to_mxfp_torch(x, _TORCH_DTYPE[elem], axis=-1,
                                     DEQUANT_SCALE_ROUNDING_MODE=mx.DequantScaleRoundingMode[mode])
    return mx.upcast_from_mxfp_torch(q, s, torch.float32, axis=-1)


def quark_fake_quantize_mx(x: torch.Tensor, elem: FloatFormat, mode: str = "even") -> torch.Tensor:
    """fake_quantize_mx(x, axis=-1, block_size=32, scale_calculation_mode=mode, mx_element_dtype=...): Quark's
    MX fake quantizer (what its FakeQuantize modules run for OCP MX FP4 / FP6 schemes), fp32 QDQ values. Needs the
    compiled extension (see _hw_module)."""
    if elem not in QUARK_FAKE_ELEMENT_FORMATS:
        raise ValueError(f"checked for {[f.name for f in QUARK_FAKE_ELEMENT_FORMATS]}, got {elem!r}")
    return _hw_module().fake_quantize_mx(x, -1, 32, mode, mx_element_dtype=_QUARK_DTYPE_NAME[elem])


def quark_even_exponent(amax: torch.Tensor, elem: FloatFormat) -> torch.Tensor:
    """The shared exponent (int32) even_round(amax, dtype) gives (it returns the scale 2^e as fp32; its floor for a
    zero amax is 2^-127, a subnormal, read here by its exponent: -127), for any of the five MX element formats."""
    scale = _utils_module().even_round(amax.float().clone(), _QUARK_DTYPE_NAME[elem])
    m, e = torch.frexp(scale)  # scale is a power of two: mantissa 0.5, exponent e + 1
    if not bool(((m == 0.5) | torch.isnan(scale)).all()):
        raise AssertionError(f"even_round returned a non-power of two: {scale}")
    return (e - 1).to(torch.int32)
