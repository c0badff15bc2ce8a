"""Conformance at the layer shapes real models have (harness.inputs.model_shapes: each model and TP share), every
expert's weights allocated, on a GPU host. The reference runs on the GPU in float64 (a `torch.device` context:
reference/ follows its inputs' device), once per (token count, numerical structure, top-k cap, biases), and every
backend that runs on the GPU is judged against it; the checkpoint is built once per (share, scheme).

A case whose checkpoint copies and float64 reference would not fit the memory one case may take
(`case_memory_budget`) is skipped with the figures. The reference dequantizes a real model's routed experts one
at a time (Kimi-K2 at TP 1 with 64 tokens routes ~300 experts of 44M weights each: 100 GB at once in float64), so
what decides is the checkpoint: Kimi-K2's bf16 layer (34 GB) three times over does not fit an H200's 98 GB
budget; its FP8 and FP4 layers do."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import math
import os
import random
import tempfile
import time
from dataclasses import dataclass

import torch

from reference.activations import ACTIVATIONS
from reference.checkpoints import make_checkpoint
from reference.moe import EAGER_WEIGHT_BYTES, fused_moe
from reference.quantizers import MX
from reference.schemes import SCHEMES

from harness.backends import Declined, backend_available, backend_device_bytes, backend_structure, known_failure_for
from harness.core.conformance import Shape, backend_shape, case_inputs, case_problem, compare_backend
from harness.core.tolerances import Comparison
from harness.inputs.model_shapes import MODEL_LAYERS, ModelLayer
from harness.platforms import Platform

__all__ = ["MODEL_SHAPE_TOKENS", "ModelShareRun", "model_share_cases", "run_model_share", "run_model_share_queued",
           "case_memory_budget", "reference_bytes", "share_bytes", "gpu_case_slot", "gpu_cases_at_once",
           "share_checkpoint", "share_reference", "distinct_experts", "is_out_of_memory"]

MODEL_SHAPE_TOKENS = (1, 8, 64)
DISTINCT_EXPERTS = 8  # experts quantized from random weights; the rest derived (make_checkpoint's distinct_experts)
_GIB = 2**30


def model_share_cases() -> list[tuple[str, str]]:
    """(share name "model/tpN", scheme) pairs: each share with bf16 and the schemes of its model's released
    checkpoints (ModelLayer.checkpoint_schemes). Every profile runs these (52 tests: a GPU host's minutes); any other
    scheme at a real shape: python -m harness model-shapes --scheme NAME."""
    return [(layer.name(tp), s) for layer in MODEL_LAYERS.values() for tp in layer.tp
            for s in ("bf16", *layer.checkpoint_schemes)]


def share_by_name(share: str) -> tuple[ModelLayer, int]:
    model, _, tp = share.partition("/tp")
    return MODEL_LAYERS[model], int(tp or 1)


def share_intermediate(layer: ModelLayer, tp: int, scheme: str) -> tuple[int, int]:
    """(I of one rank's weights, how many of those channels are real) for this scheme. I / tp when it is whole
    weight blocks; else, for MX weights, vLLM's gpt-oss MXFP4 layout (I / tp = 720 and 360 at TP 4 and 8): each
    rank's weights hold I / tp rounded up to two blocks (768, 384), the checkpoint's I is sliced per rank in whole
    blocks (ceil(I / 32 / tp) x 32 channels: 736, 384), and the rest of a rank's rows stay zero (codes, scales,
    biases: allocated as zeros). The last rank holds the remainder: TP 4: 672 real of 768, TP 8: 192 of 384. That
    last rank is the share modelled here. Other schemes' partial blocks stay an error."""
    i = layer.intermediate_size // tp
    sch = SCHEMES[scheme]
    block = max(sch.k_multiple(), sch.n_multiple())
    if i % block == 0 or sch.weight.kind is not MX:
        return i, i
    rank = -(-i // (2 * block)) * 2 * block
    shard = -(-(layer.intermediate_size // block) // tp) * block  # vLLM's slice of the checkpoint per rank
    return rank, layer.intermediate_size - (tp - 1) * shard


def zero_padded_channels(ckpt, real: int):
    """ckpt with its intermediate channels from `real` on zero: GEMM1's rows for them (gate and up) and GEMM2's
    columns, codes and block scales, and their GEMM1 biases (share_intermediate's padded last rank)."""
    act, i = ckpt.activation, ckpt.intermediate_size
    if real == i:
        return ckpt
    ch = torch.arange(real, i)
    rows = (torch.stack([2 * ch, 2 * ch + 1]).flatten() if act.interleaved else torch.cat([ch, ch + i])) \
        if act.gated else ch

    def cut(t: torch.Tensor | None, dim: int, index=None):
        if t is None:
            return None
        t = t.clone()
        if index is not None:
            t.index_fill_(dim, index.to(t.device), 0)
        else:  # GEMM2's K (I) along the last dim, packed: the same fraction of it
            if (real * t.shape[-1]) % i:
                raise ValueError(f"{real} of {i} channels is not a whole number of packed columns ({t.shape[-1]})")
            t[..., real * t.shape[-1] // i:] = 0
        return t

    w13 = dataclasses.replace(ckpt.w13, data=cut(ckpt.w13.data, 1, rows), scale=cut(ckpt.w13.scale, 1, rows))
    w2 = dataclasses.replace(ckpt.w2, data=cut(ckpt.w2.data, -1), scale=cut(ckpt.w2.scale, -1))
    return dataclasses.replace(ckpt, w13=w13, w2=w2, b13=cut(ckpt.b13, 1, rows))


def reference_bytes(layer: ModelLayer, tp: int, scheme: str, tokens: int) -> int:
    """What one case holds on the device at its peak: three copies of the checkpoint (the case's, the backend's
    private copy, the backend's prepared form), the routed experts' float64 weights (up to EAGER_WEIGHT_BYTES at
    once, with the fp32 dequantization and the bound's temporaries: 2.5 float64 copies in all; beyond it one expert
    at a time, ~6 float64 copies of one expert, reference.moe.RoutedWeights) and the trace (every intermediate of
    every (token, k) pair in float64, with the bound's per-pair deviations: 3 copies).
    gpt-oss-120b bf16 at 64 tokens: 77 GB by the eager count, 78.7 GB seen on the H200 (results/gpu-issue24/run-9)."""
    e, k, h, i = layer.num_experts, layer.top_k, layer.hidden_size, share_intermediate(layer, tp, scheme)[0]
    n13 = 2 * i  # every model here is gated
    weights = n13 * h + h * i
    routed = min(e, tokens * k)
    wq = SCHEMES[scheme].weight
    # checkpoint bytes per weight: bf16, FP4 codes packed two per byte, FP6/FP8 codes one per byte; block scales
    per = 2.0 if wq is None else (0.5 if wq.elem.ebits + wq.elem.mbits == 3 else 1.0) + 1 / 16
    # w13 and w2 together eager, or both one expert at a time (reference.moe.routed_weights); routed counts pairs,
    # the reference the distinct experts among them, which may be few enough for eager: the larger of the two
    eager = routed * weights * 8
    f64 = eager * 2.5 if eager <= EAGER_WEIGHT_BYTES else max(EAGER_WEIGHT_BYTES * 2.5, weights * 8 * 6)
    trace = tokens * k * (2 * n13 + 4 * i + 4 * h) * 8 * 3
    return int(f64 + trace + 3 * e * weights * per)


def case_memory_budget() -> int:
    """Bytes one real-shape case may hold on the GPU: MOE_CONFORMANCE_CASE_GB, by default 70% of the GPU's memory
    (the H200: 98 GB, so gpt-oss-120b's whole layer at 64 tokens fits; Kimi-K2 and DeepSeek-V3 at TP 1 from 8
    tokens on do not), 48 GB without a GPU."""
    given = os.environ.get("MOE_CONFORMANCE_CASE_GB")
    if given is not None:
        return int(float(given) * _GIB)
    if torch.cuda.is_available():
        return int(0.7 * torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
    return 48 * _GIB


SLOT_GB = 4  # the GPU's memory is shared out in slots of this size


def share_bytes(share: str, scheme: str, tokens=MODEL_SHAPE_TOKENS) -> int:
    """What a (share, scheme) test holds at most: its largest case that fits the budget."""
    layer, tp = share_by_name(share)
    fits = [b for b in (reference_bytes(layer, tp, scheme, n) for n in tokens) if b <= case_memory_budget()]
    return max(fits, default=0)


def gpu_cases_at_once() -> int:
    """Real-shape tests one GPU runs at once: MOE_CONFORMANCE_GPU_CASES (default 3). More processes on one GPU
    time-slice it and each one's host work slows the others: at 16 (every pytest-xdist worker of the H200's host)
    a test took 5-10x its time alone (results/gpu-issue24/run-5 against run-6)."""
    return max(1, int(os.environ.get("MOE_CONFORMANCE_GPU_CASES", "3")))


@contextlib.contextmanager
def gpu_case_slot(device, need_bytes: int | None, folder: str | None = None, slots: int | None = None,
                  at_once: int | None = None):
    """The GPU memory a real-shape test needs, as ceil(need / SLOT_GB) of the GPU's slots (80% of its memory in
    SLOT_GB pieces), and one of `at_once` (gpu_cases_at_once) runner places, held across pytest-xdist workers by
    file locks: taken all at once or not at all (then tried again after a random pause), so that concurrent tests
    never exceed the GPU's memory and never deadlock. need_bytes None: every slot (the GPU to this test alone),
    behind a gate: the request holds the gate file exclusively while it waits (blocking) for the runner place and
    the slots in order, and other requests take slots only under a shared hold of the gate, so running tests drain
    and no new one starts meanwhile (otherwise freed slots go to waiting tests at once, and it waits for the whole
    queue). A request never blocks while it holds a slot, so there is still no deadlock."""
    if slots is None:
        total = torch.cuda.get_device_properties(device).total_memory if str(device) != "cpu" else 0
        slots = max(1, int(0.8 * total // (SLOT_GB * _GIB)))
    at_once = gpu_cases_at_once() if at_once is None else at_once
    need = slots if need_bytes is None else min(slots, max(1, math.ceil(need_bytes / (SLOT_GB * _GIB))))
    folder = folder or os.path.join(tempfile.gettempdir(), f"moe-conformance-gpu-slots-{os.getuid()}")
    os.makedirs(folder, exist_ok=True)
    pause = random.Random(os.getpid())

    def take(names, count):
        held = []
        for name in names:
            f = open(os.path.join(folder, name), "w")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held.append(f)
            except BlockingIOError:
                f.close()
            if len(held) == count:
                break
        return held

    def take_all():
        held = []
        for name in ["runner-0", *(f"slot-{n}" for n in range(slots))]:
            held.append(open(os.path.join(folder, name), "w"))
            fcntl.flock(held[-1], fcntl.LOCK_EX)  # blocking: the tests holding it finish; none starts (the gate)
        return held

    with open(os.path.join(folder, "gate"), "w") as gate:
        while True:
            if need_bytes is None:
                fcntl.flock(gate, fcntl.LOCK_EX)
                held = take_all()
            else:
                try:
                    fcntl.flock(gate, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:  # a request for every slot is waiting or running
                    held = []
                else:
                    held = take([f"runner-{n}" for n in range(at_once)], 1)
                    if held:
                        held += take([f"slot-{n}" for n in range(slots)], need)
                    fcntl.flock(gate, fcntl.LOCK_UN)
            ok = len(held) == need + 1
            try:
                if ok:
                    yield need
                    return
            finally:
                if ok and str(device) != "cpu":
                    torch.cuda.empty_cache()
                for f in held:
                    fcntl.flock(f, fcntl.LOCK_UN)
                    f.close()
                if need_bytes is None:
                    fcntl.flock(gate, fcntl.LOCK_UN)
            time.sleep(pause.uniform(0.05, 0.5))


def distinct_experts(layer: ModelLayer, tp: int, scheme: str) -> int:
    """Experts to quantize from random weights so that rolling their rows by whole scale blocks derives all the
    others (make_checkpoint's distinct_experts): shift s rolls w13 by s blocks within I and w2 by s blocks within H,
    which repeat only after lcm(I, H) / block shifts. DISTINCT_EXPERTS, or more where that is short (Qwen3-Next:
    512 experts, 128-row FP8 blocks, I 512 and H 2048 give 16 shifts: 32 experts)."""
    block = SCHEMES[scheme].n_multiple()
    shifts = math.lcm(share_intermediate(layer, tp, scheme)[0] // block, layer.hidden_size // block)
    return max(DISTINCT_EXPERTS, math.ceil(layer.num_experts / shifts))


def share_checkpoint(share: str, scheme: str, activation, device, seed: int = 0):
    """The share's checkpoint with biases (distinct_experts() quantized from random weights, the rest derived), on
    `device`; a padded last-rank share (share_intermediate) with its padding zero. A backend that takes no biases gets it without them (`dataclasses.replace(ckpt, b13=None, b2=None)`:
    its static input scales were calibrated with them, still a valid checkpoint)."""
    layer, tp = share_by_name(share)
    rank, real = share_intermediate(layer, tp, scheme)
    return zero_padded_channels(make_checkpoint(scheme, activation, layer.num_experts, layer.hidden_size, rank,
                                                seed=seed, with_bias=True,
                                                distinct_experts=distinct_experts(layer, tp, scheme), device=device),
                                real)


def share_reference(backend, shape: Shape, ckpt, device, seed: int = 0):
    """(inputs on the host, reference output, trace) of one case for `backend`'s structure, in float64 on
    `device`."""
    inputs = case_inputs(shape, seed)
    with torch.device(device):
        on = [t.to(device) for t in inputs]
        out, trace = fused_moe(on[0], ckpt, on[1], on[2], structure=backend_structure(backend), trace=True)
    return inputs, out, trace


@dataclass
class ModelShareRun:
    """One (share, tokens, scheme, backend) of a real-shape run: its comparison, or why it did not run."""

    case: str  # "gpt-oss-120b/tp2/T8"
    scheme: str
    backend: str
    result: Comparison | None = None
    skipped: str = ""
    known_failure: object = None  # the backend's KnownFailure record covering this case, if any
    seconds: float = 0.0
    tokens: int = 0
    out_of_memory: bool = False  # the GPU ran out of memory in this run (skipped says where)
    alone: bool = False  # run again with the GPU to itself after running out of memory beside other cases

    @property
    def what(self) -> str:
        return f"{self.case}/{self.scheme}/{self.backend}"

    def line(self) -> str:
        if self.result is None:
            return f"skipped  {self.what}: {self.skipped}"
        r = self.result
        verdict = "passed" if r.ok else ("xfailed" if self.known_failure else "FAILED")
        return (f"{verdict:<8} {self.what}: {r.max_ratio:.3f} of the bound, worst {r.worst_ulps:.3g} ulp "
                f"({self.seconds:.1f}s{', the GPU to itself' if self.alone else ''})")


def is_out_of_memory(exc: BaseException) -> bool:
    """The device ran out of memory: torch's error, or XLA's RESOURCE_EXHAUSTED (jax_ragged_dot)."""
    return isinstance(exc, torch.OutOfMemoryError) or "RESOURCE_EXHAUSTED" in str(exc) or (
        "out of memory" in str(exc).lower() and isinstance(exc, RuntimeError))


def run_model_share(backends: dict, share: str, scheme: str, host: Platform, device, tokens=MODEL_SHAPE_TOKENS,
                    seed: int = 0, activation: str | None = None, gpu_only: bool = True,
                    progress=None, only: set[tuple[int, str]] | None = None) -> list[ModelShareRun]:
    """Every backend of `backends` at this share and scheme, at each token count, against one reference per
    (tokens, structure, top-k cap, biases), with the model's activation unless `activation` is given. gpu_only:
    backends that run on the host CPU are left to the CPU's cases (skipped with that reason). only: just these
    (tokens, backend name) runs. A run that exhausts the device's memory (building, the reference, the backend) is
    returned with out_of_memory set, not raised: run_model_share_queued runs it again with the GPU to itself."""
    layer, tp = share_by_name(share)
    act = ACTIVATIONS[activation or layer.activation]
    runs: list[ModelShareRun] = []
    built: list = []

    def checkpoint(has_bias: bool):
        # built once per test, with biases; a backend that takes none gets the same checkpoint without them (its
        # static input scales were calibrated with them: still a valid checkpoint). Building is the test's largest
        # host cost (Mixtral TP 8 FP8: 13 s on one core), so never twice
        if not built:
            built.append(share_checkpoint(share, scheme, act, device, seed))
        return built[0] if has_bias else dataclasses.replace(built[0], b13=None, b2=None)

    for n in tokens:
        rank, real = share_intermediate(layer, tp, scheme)
        case = f"{share}/T{n}" + (f" (last rank, vLLM's padding: I {rank}, {real} real)" if rank != real else "")
        shape = dataclasses.replace(Shape(*layer.shape(tp, n)), intermediate_size=rank)
        need = reference_bytes(layer, tp, scheme, n)
        todo = []
        for name, backend in backends.items():
            if only is not None and (n, name) not in only:
                continue
            problem, ok, reason = case_problem(backend, SCHEMES[scheme], act, host, shape)
            if ok:
                ok, reason = backend_available(backend, host)
            if ok and gpu_only and str(getattr(backend, "device", "cpu")) == "cpu":
                ok, reason = False, ("runs on the host CPU: its real-model cases are the CPU's (tools/bound_growth.py "
                                     "--real-shares); here only the GPU's backends")
            own = backend_device_bytes(backend, problem) if ok else 0
            if ok and need + own > case_memory_budget():
                ok, reason = False, (f"the checkpoint's three copies (the case's, the backend's private copy and "
                                     f"its prepared form) and the float64 reference of "
                                     f"{min(layer.num_experts, n * layer.top_k)} routed experts need "
                                     f"~{need / _GIB:.0f} GB"
                                     + (f", with the {own / _GIB:.0f} GB the backend declares (device_bytes) "
                                        f"~{(need + own) / _GIB:.0f} GB," if own else "")
                                     + f" > the {case_memory_budget() / _GIB:.3g} GB a case may take "
                                     "(MOE_CONFORMANCE_CASE_GB)")
            if not ok:
                runs.append(ModelShareRun(case, scheme, name, skipped=reason, tokens=n))
                continue
            bshape = backend_shape(backend, shape)
            todo.append(((backend_structure(backend).name, bshape.top_k, problem.has_bias), name, backend, bshape))
        reference = {}
        for key, name, backend, bshape in sorted(todo, key=lambda t: (t[0][2], t[0][0], t[0][1], t[1])):
            start = time.perf_counter()
            run = ModelShareRun(case, scheme, name, known_failure=known_failure_for(backend, scheme, key[2]), tokens=n)
            inputs = out = trace = None
            exhausted = False
            try:
                ckpt = checkpoint(key[2])
                if key not in reference:
                    inputs = out = trace = None
                    reference.clear()  # one reference (and its float64 trace) at a time
                    reference[key] = share_reference(backend, bshape, ckpt, device, seed)
                inputs, out, trace = reference[key]
                run.result = compare_backend(backend, ckpt, inputs, out, trace, run.what, diagnose=False)
            except ValueError as exc:  # the scheme's block does not divide this share (vLLM pads or refuses it)
                if built:  # raised by the reference or the backend, not by building
                    raise
                run.skipped = str(exc)
            except Declined as exc:
                run.skipped = str(exc)
            except Exception as exc:
                if not is_out_of_memory(exc):
                    raise
                run.out_of_memory = exhausted = True
                run.skipped = f"out of GPU memory: {(str(exc).splitlines() or [type(exc).__name__])[0][:300]}"
                if str(device) != "cpu":
                    free, total = torch.cuda.mem_get_info(device)
                    run.skipped += f" ({free / _GIB:.1f} of {total / _GIB:.0f} GB free at that point)"
            if exhausted:  # the exception (and its frames' tensors) is gone here; drop the reference too
                inputs = out = trace = None
                reference.clear()
                if str(device) != "cpu":
                    torch.cuda.empty_cache()
            run.seconds = time.perf_counter() - start
            runs.append(run)
            if progress:
                progress(run)
        inputs = out = trace = None  # nothing of this token count's reference outlives it
        reference.clear()
    built.clear()
    return runs


def run_model_share_queued(backends: dict, share: str, scheme: str, host: Platform, device, progress=None,
                           **options) -> list[ModelShareRun]:
    """run_model_share inside the share's GPU slots (gpu_case_slot(share_bytes)). The slots count the reference
    and the checkpoint's copies, not what a backend allocates for itself (dequantize_all: every expert in bf16,
    21 GB of Kimi-K2's w13; XLA's copies), so a backend can still exhaust the memory beside other cases
    (results/gpu-issue25/run-6): such runs are run again afterwards with every slot held (the GPU to this test),
    and a run that exhausts it alone comes back with out_of_memory and alone set (test_model_shape fails on it)."""
    with gpu_case_slot(device, share_bytes(share, scheme)):
        runs = run_model_share(backends, share, scheme, host, device, progress=progress, **options)
    crowded = {(r.tokens, r.backend) for r in runs if r.out_of_memory}
    if not crowded:
        return runs
    with gpu_case_slot(device, None):
        again = run_model_share(backends, share, scheme, host, device, progress=progress, only=crowded, **options)
    for r in again:
        r.alone = True
        if r.out_of_memory:
            r.skipped = f"{r.skipped} (with the GPU to itself: the reference and this backend need more)"
    again = {(r.tokens, r.backend): r for r in again}
    return [again.get((r.tokens, r.backend), r) if r.out_of_memory else r for r in runs]
