"""The Triton kernels a backend's forward launches, compiled for a GPU target on a machine without that GPU.

The interpreter runs the kernels' Python, not the compiler: a kernel that passes every CPU test may still fail to
compile (a loop-carried variable that changes type, a layout the backend refuses), which a GPU run then finds at
the cost of a device call. Here the forward runs with every kernel of `harness.backends.triton_kernels` replaced
by a recorder (nothing executes: the launches' arguments are what the forward would pass), and each distinct
launch is compiled for the target with the installed Triton's own ptxas.

    python -m harness.backends.compile_check --case triton_bitplace/w_nvfp4_a_nvfp4/SILU [--case ...]
        [--tokens 1 64] [--skip moe_gemm_kernel] [--configure block_n=128 ...]

A case may carry its own launch parameters after an @ (`triton_bitplace_gluon/w_nvfp4/SILU@block_n=128,pdl=2`):
tile keys for backend.configure (over --configure's), `tokens` (instead of --tokens), `exponent_add` and
`biased_scales` (triton_bitplace.NVFP4_EXPONENT_ADD / NVFP4_BIASED_SCALES for that case), so that many variants
compile in one process (each distinct launch once). One line a case says what it launched: `case C, T tokens: N launches (name xK, ...), D dependents`;
one line a compiled launch, with what ptxas said (registers, spill bytes, wgmma serialized: compile_with_ptxas_log).

Must be imported with TRITON_INTERPRET unset or 0 (the kernels are then JIT functions the compiler takes);
run as a module it sees to that itself. suites/test_triton_helpers.py runs it in a subprocess.
"""

from __future__ import annotations

import os

if __name__ == "__main__":
    os.environ["TRITON_INTERPRET"] = "0"  # before any kernel is defined

import argparse
import re
import sys
import time

import torch

SM90 = ("cuda", 90, 32)
# the kernels the backends launch (suites/test_triton_helpers.py checks every `K.<name>[grid]` site is here)
LAUNCHED_KERNELS = ("moe_gemm_kernel", "moe_align_kernel", "mx_quantize_kernel", "nvfp4_quantize_kernel",
                    "fp8_quantize_kernel", "splitk_epilogue_kernel", "splitk_topk_reduce_kernel", "topk_reduce_kernel",
                    "bitplace_partials_kernel", "align_count_kernel", "align_layout_kernel", "align_scatter_kernel",
                    "bf16_prefill_kernel")
_DTYPES = {torch.bfloat16: "bf16", torch.float32: "fp32", torch.uint8: "u8", torch.int32: "i32", torch.int64: "i64",
           torch.float16: "fp16", torch.int8: "i8", torch.int16: "i16"}
_OPTIONS = ("num_warps", "num_stages", "maxnreg", "launch_pdl", "enable_fp_fusion")


class _Recorded(list):
    """(kernel name, JIT function, args, kwargs) of each launch."""


class LaunchLog:
    """A stand-in for a kernel's launcher (K.<kernel>[grid](...)) in tests: each launch's grid goes to `grids`,
    then the real kernel runs it (run=True) or its arguments go to `calls` as (args, kwargs) and nothing runs."""

    def __init__(self, kernel, run: bool = True):
        self.kernel, self.run, self.grids, self.calls = kernel, run, [], []

    def __getitem__(self, grid):
        self.grids.append(grid)
        if self.run:
            return self.kernel[grid]
        return lambda *args, **kwargs: self.calls.append((args, kwargs))


def record_launches(backend, ckpt, x, w, ids) -> _Recorded:
    """The forward's kernel launches, none executed (their outputs stay as allocated; align_layouts' arrays, which
    host ops index by, come from align_layouts_torch)."""
    from harness.backends import triton_kernels as K
    import triton

    if K.INTERPRET:
        raise RuntimeError("compile_check needs TRITON_INTERPRET=0 before harness.backends.triton_kernels is imported")
    launches = _Recorded()
    kernels = {name: getattr(K, name) for name in LAUNCHED_KERNELS}
    assert all(isinstance(fn, triton.runtime.jit.JITFunction) for fn in kernels.values()), kernels

    class _Recorder:
        def __init__(self, name, fn):
            self.name, self.fn = name, fn

        def __getitem__(self, grid):
            return lambda *args, **kwargs: launches.append((self.name, self.fn, args, kwargs))

    from harness.backends import triton_emulation

    def align_layouts(*args, **kwargs):  # its launches recorded; the arrays later host ops index by, from torch
        real_align_layouts(*args, **kwargs)
        return triton_emulation.align_layouts_torch(*args, **kwargs)

    real_align_layouts = triton_emulation.align_layouts
    try:
        for name, fn in kernels.items():
            setattr(K, name, _Recorder(name, fn))
        triton_emulation.align_layouts = align_layouts
        backend.forward(backend.prepare(ckpt), x, w, ids)
    finally:
        for name, fn in kernels.items():
            setattr(K, name, fn)
        triton_emulation.align_layouts = real_align_layouts
    return launches


def compile_launch(fn, args: tuple, kwargs: dict, target=SM90):
    """One launch compiled for target: the signature from the arguments' types, constexprs from the launch, else
    the kernel's defaults, 16-byte aligned pointers and integers divisible by 16 marked, and an integer equal to 1
    made a constexpr, as a launch specialises them."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    from triton.runtime.jit import mangle_type
    from triton.tools.tensor_descriptor import TensorDescriptor as TritonTensorDescriptor

    values = dict(zip(fn.arg_names, args))
    values.update({k: v for k, v in kwargs.items() if k not in _OPTIONS})
    signature, constexprs, aligned = {}, {}, {}
    for i, param in enumerate(fn.params):
        if param.name in values:
            value = values[param.name]
        elif param.has_default:
            value = param.default
        else:
            raise TypeError(f"{fn.fn.__name__}: no value for {param.name}")
        if param.is_constexpr or value is None or (type(value) is int and value == 1 and not param.do_not_specialize):
            signature[param.name], constexprs[param.name] = "constexpr", value
        elif isinstance(value, TensorDescriptor):  # a Gluon kernel's TMA descriptor: its box and shared layout
            signature[param.name] = f"tensordesc<{_DTYPES[value.base.dtype]}{list(value.block_shape)},{value.layout!r}>"
        elif isinstance(value, TritonTensorDescriptor):  # a Triton kernel's host TMA descriptor: its box
            signature[param.name] = mangle_type(value)
        elif isinstance(value, torch.Tensor):
            signature[param.name] = "*" + _DTYPES[value.dtype]
            if value.data_ptr() % 16 == 0:
                aligned[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, bool):
            signature[param.name] = "i1"
        elif isinstance(value, int):
            signature[param.name] = "i32" if -2**31 <= value < 2**31 else "i64"
            if value % 16 == 0:
                aligned[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            signature[param.name] = "fp32"
        else:
            raise TypeError(f"{fn.fn.__name__}: argument {param.name} of type {type(value).__name__}")
    source = GluonASTSource if fn.is_gluon() else triton.compiler.ASTSource
    src = source(fn=fn, signature=signature, constexprs=constexprs, attrs=aligned)
    options = {k: kwargs[k] for k in _OPTIONS if kwargs.get(k) is not None}
    return triton.compile(src, target=GPUTarget(*target), options=options)


def compile_with_ptxas_log(fn, args: tuple, kwargs: dict, target=SM90):
    """compile_launch, and what ptxas said of the machine code: (compiled, "N registers, S spill bytes" plus ", wgmma
    serialized (ptxas C7515)" where ptxas could not keep the asynchronous MMAs in flight: an instruction other than
    a wgmma defines accumulator registers while MMAs run, so each waits for the one before: the flattened persistent
    loop's accumulator reset, results/gpu-issue28/run-19). Empty where the kernel came from Triton's cache (no ptxas
    run: point TRITON_CACHE_DIR at an empty folder to see it)."""
    import contextlib
    import io

    from triton import knobs

    log, dump = io.StringIO(), knobs.nvidia.dump_ptxas_log
    knobs.nvidia.dump_ptxas_log = True  # Triton prints ptxas -v's log to stdout
    try:
        with contextlib.redirect_stdout(log):
            compiled = compile_launch(fn, args, kwargs, target)
    finally:
        knobs.nvidia.dump_ptxas_log = dump
    text = log.getvalue()
    registers = re.findall(r"Used (\d+) registers", text)
    if not registers:
        return compiled, ""
    spills = sum(int(b) for b in re.findall(r"(\d+) bytes spill stores", text))
    serialized = ", wgmma serialized (ptxas C7515)" if "C7515" in text else ""
    return compiled, f"{max(map(int, registers))} registers, {spills} spill bytes{serialized}" + \
        warp_specialization(compiled.asm["ptx"])


def warp_specialization(ptx: str) -> str:
    """", warp-specialized: T threads, partitions at R1 / R2 / ... registers" where the kernel's warpgroups move their
    register budgets apart (setmaxnreg: a producer down, its consumers up; ptxas's count is then the launch's
    even share), else ""."""
    budgets = sorted({int(r) for r in re.findall(r"setmaxnreg\.(?:inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx)})
    if not budgets:
        return ""
    threads = re.search(r"\.reqntid (\d+)", ptx)
    return (f", warp-specialized: {threads.group(1) if threads else '?'} threads, partitions at "
            f"{' / '.join(map(str, budgets))} registers")


def dependent_launch_violations(ptx: str, kwargs: dict) -> list[str]:
    """A programmatic dependent's PTX against triton_kernels.PDL_ORDER: it waits (griddepcontrol.wait), stores
    nothing before its wait and loads nothing before it but, in GEMM2's mode (PDL 2), its block's expert (one
    ld.global: the routing, complete before it starts; its weights go to L2 by bulk prefetch, which is no load), and
    in GEMM1's PDL 3 the call's expert ids (loads marked L1::evict_last: an input of the forward, written before the
    routing launch, which is no dependent, started)."""
    lines = ptx.splitlines()
    waits = [i for i, line in enumerate(lines) if "griddepcontrol.wait" in line]
    if not waits:
        return ["launched as a programmatic dependent but never waits (griddepcontrol.wait)"]
    # instructions without their guard predicate (Triton writes masked stores as "@%p1 st.global ...")
    before = [re.sub(r"^@!?%\w+\s+", "", line.strip()) for line in lines[:waits[0]]]
    problems = []
    stores = [line for line in before if line.startswith(("st.", "atom.", "red.", "cp.async", "cp.reduce"))
              and "prefetch" not in line and not line.startswith("st.shared")]
    if stores:
        problems.append(f"writes or copies before its wait: {stores[:3]}")
    loads = [line for line in before if line.startswith(("ld.global", "ld.param.", "ld.")) and
             not line.startswith(("ld.param", "ld.shared", "ld.local", "ld.const"))
             and not (kwargs.get("PDL") == 3 and "L1::evict_last" in line)]
    if len(loads) > (1 if kwargs.get("PDL") == 2 else 0):
        problems.append(f"{len(loads)} global loads before its wait: {loads[:3]}")
    return problems


def main(argv=None) -> int:
    from harness.backends import load_backend
    from reference.checkpoints import make_checkpoint

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", action="append", required=True, metavar="BACKEND/SCHEME/ACTIVATION")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1])
    ap.add_argument("--skip", action="append", default=[], metavar="KERNEL", help="record, but do not compile")
    ap.add_argument("--configure", action="append", default=[], metavar="KEY=INT",
                    help="launch parameters for every case (backend.configure: tiles and schedules)")
    ap.add_argument("--intermediate", type=int, default=128,
                    help="the experts' intermediate size (GEMM2's K: 128 is one chunk, which the compiler folds)")
    args = ap.parse_args(argv)
    from harness.backends import triton_bitplace

    params = dict(kv.split("=", 1) for kv in args.configure)
    seen, failed = set(), 0
    for case in args.case:
        spec, _, own = case.partition("@")
        backend_name, scheme, activation = spec.split("/")
        own = dict(kv.split("=", 1) for kv in own.split(",")) if own else {}
        case_tokens = [int(own.pop("tokens"))] if "tokens" in own else args.tokens
        exponent_add, biased = triton_bitplace.NVFP4_EXPONENT_ADD, triton_bitplace.NVFP4_BIASED_SCALES
        triton_bitplace.NVFP4_EXPONENT_ADD = bool(int(own.pop("exponent_add", exponent_add)))
        triton_bitplace.NVFP4_BIASED_SCALES = bool(int(own.pop("biased_scales", biased)))
        backend = load_backend(backend_name)
        backend.device = "cpu"
        tiles = {**params, **own}
        if tiles:
            backend.configure(**{k: int(v) for k, v in tiles.items()})
        ckpt = make_checkpoint(scheme, activation, 8, 256, args.intermediate, seed=0, with_bias=True)
        for tokens in case_tokens:
            g = torch.Generator().manual_seed(tokens)
            x = torch.randn(tokens, 256, generator=g).to(torch.bfloat16)
            w, ids = torch.randn(tokens, 8, generator=g).softmax(-1).topk(2)
            launches = record_launches(backend, ckpt, x, w, ids)
            names = {}
            for name, *_ in launches:
                names[name] = names.get(name, 0) + 1
            print(f"case {case}, {tokens} tokens: {len(launches)} launches ("
                  f"{', '.join(f'{n} x{k}' for n, k in names.items())}), "
                  f"{sum(bool(kw.get('launch_pdl')) for *_, kw in launches)} dependents", flush=True)
            for name, fn, a, kw in launches:
                key = (name, tuple(sorted((k, repr(v)) for k, v in kw.items())),
                       tuple(str(v.dtype) if isinstance(v, torch.Tensor) else type(v).__name__ for v in a))
                if name in args.skip or key in seen:
                    continue
                seen.add(key)
                t0 = time.time()
                try:
                    compiled, machine = compile_with_ptxas_log(fn, a, kw)
                    shared = getattr(compiled.metadata, "shared", 0)  # bytes a program; 227 KB an SM on sm90
                    print(f"compiled {name} for sm90 ({time.time() - t0:.1f} s; {case}, {tokens} tokens"
                          f"{'; ' + machine if machine else ''}{f'; {shared / 1024:.1f} KB shared' if shared else ''}"
                          f"{'; tile-major weights' if kw.get('TILE_MAJOR') else ''})",
                          flush=True)
                    problems = dependent_launch_violations(compiled.asm["ptx"], kw) if kw.get("launch_pdl") else []
                    if problems:
                        failed += 1
                        print(f"FAILED {name} ({case}, {tokens} tokens): {'; '.join(problems)}", flush=True)
                    elif kw.get("launch_pdl"):
                        print(f"dependent launch of {name} (PDL {int(kw.get('PDL', 1))}): waits before any other "
                              "load or store", flush=True)
                except Exception as exc:  # noqa: BLE001 - every failing kernel is reported; the exit status says so
                    failed += 1
                    cause = f" ({type(exc.__cause__).__name__}: {exc.__cause__})" if exc.__cause__ else ""
                    print(f"FAILED {name} ({case}, {tokens} tokens): {type(exc).__name__}: {str(exc)[-600:]}{cause}",
                          flush=True)
        triton_bitplace.NVFP4_EXPONENT_ADD, triton_bitplace.NVFP4_BIASED_SCALES = exponent_add, biased
    print(f"{len(seen)} launches compiled, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
