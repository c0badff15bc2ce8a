"""Conformance at the layer shapes real models have (harness.inputs.model_shapes: each model and TP share), every
expert's weights allocated, on a GPU host. The reference runs on the GPU in float64 (a `torch.device` context:
reference/ follows its inputs' device), once per (token count, numerical structure, top-k cap, biases), and every
backend that runs on the GPU is judged against it; the checkpoint is built once per (share, scheme).

A case whose float64 reference (the routed experts' dequantized weights) and checkpoint copies would not fit the
memory one case may take (`case_memory_budget`) is skipped with the figures: e.g. Kimi-K2 at TP 1 with 64
tokens routes ~300 experts of 44M weights each (100 GB in float64); its TP 8 share runs."""

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
from reference.moe import fused_moe
from reference.schemes import SCHEMES

from harness.backends import Declined, backend_available, backend_structure, known_failure_for
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


def reference_bytes(layer: ModelLayer, tp: int, scheme: str, tokens: int) -> int:
    """What one case holds on the device at its peak: the routed experts' dequantized weights (fp32, then the
    float64 copy the reference and its trace keep, and the bound's temporaries: 2.5 float64 copies in all) plus
    three copies of the checkpoint (the case's, the backend's private copy, the backend's prepared form).
    gpt-oss-120b bf16 at 64 tokens: 77 GB by this count, 78.7 GB seen on the H200 (results/gpu-issue24/run-9)."""
    e, k, h, i = layer.num_experts, layer.top_k, layer.hidden_size, layer.intermediate_size // tp
    n13 = 2 * i  # every model here is gated
    weights = n13 * h + h * i
    routed = min(e, tokens * k)
    wq = SCHEMES[scheme].weight
    # checkpoint bytes per weight: bf16, FP4 codes packed two per byte, FP6/FP8 codes one per byte; block scales
    per = 2.0 if wq is None else (0.5 if wq.elem.ebits + wq.elem.mbits == 3 else 1.0) + 1 / 16
    return int(routed * weights * 8 * 2.5 + 3 * e * weights * per)


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
    never exceed the GPU's memory and never deadlock. need_bytes None: every slot (the GPU to this test alone)."""
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

    while True:
        held = take([f"runner-{n}" for n in range(at_once)], 1)
        if held:
            held += take([f"slot-{n}" for n in range(slots)], need)
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
        time.sleep(pause.uniform(0.05, 0.5))


def distinct_experts(layer: ModelLayer, tp: int, scheme: str) -> int:
    """Experts to quantize from random weights so that rolling their rows by whole scale blocks derives all the
    others (make_checkpoint's distinct_experts): shift s rolls w13 by s blocks within I and w2 by s blocks within H,
    which repeat only after lcm(I, H) / block shifts. DISTINCT_EXPERTS, or more where that is short (Qwen3-Next:
    512 experts, 128-row FP8 blocks, I 512 and H 2048 give 16 shifts: 32 experts)."""
    block = SCHEMES[scheme].n_multiple()
    shifts = math.lcm((layer.intermediate_size // tp) // block, layer.hidden_size // block)
    return max(DISTINCT_EXPERTS, math.ceil(layer.num_experts / shifts))


def share_checkpoint(share: str, scheme: str, activation, device, seed: int = 0):
    """The share's checkpoint with biases (distinct_experts() quantized from random weights, the rest derived), on
    `device`. A backend that takes no biases gets it without them (`dataclasses.replace(ckpt, b13=None, b2=None)`:
    its static input scales were calibrated with them, still a valid checkpoint)."""
    layer, tp = share_by_name(share)
    return make_checkpoint(scheme, activation, layer.num_experts, layer.hidden_size, layer.intermediate_size // tp,
                           seed=seed, with_bias=True, distinct_experts=distinct_experts(layer, tp, scheme),
                           device=device)


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
        case = f"{share}/T{n}"
        shape = Shape(*layer.shape(tp, n))
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
            if ok and need > case_memory_budget():
                ok, reason = False, (f"the float64 reference of {min(layer.num_experts, n * layer.top_k)} routed "
                                     f"experts and the checkpoint's copies need ~{need / _GIB:.0f} GB > the "
                                     f"{case_memory_budget() / _GIB:.3g} GB a case may take "
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
            try:
                ckpt = checkpoint(key[2])
                if key not in reference:
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
                run.out_of_memory = True
                run.skipped = f"out of GPU memory: {str(exc).splitlines()[0][:300]}"
                reference.clear()
                if str(device) != "cpu":
                    torch.cuda.empty_cache()
            run.seconds = time.perf_counter() - start
            runs.append(run)
            if progress:
                progress(run)
        reference.clear()
    built.clear()
    return runs


def run_model_share_queued(backends: dict, share: str, scheme: str, host: Platform, device, progress=None,
                           **options) -> list[ModelShareRun]:
    """run_model_share inside the share's GPU slots (gpu_case_slot(share_bytes)). The slots count the reference
    and the checkpoint's copies, not what a backend allocates for itself (dequantize_all: every expert in bf16,
    21 GB of Kimi-K2's w13; XLA's copies), so a backend can still exhaust the memory beside other cases
    (results/gpu-issue25/run-6): such runs are run again afterwards with every slot held (the GPU to this test),
    and only a run that exhausts it alone stays skipped, saying so."""
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
