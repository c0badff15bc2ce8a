"""What the harness does so that no backend can fool or stall it: every backend call gets private
copies of the case's inputs and checkpoint (cached and shared across backends otherwise), a backend that
writes into them fails saying which argument it modified, and every call runs under a time limit.

Backends under test are buggy by definition; one of them must never change another's verdict.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

import torch

from reference.checkpoints import MoECheckpoint, QuantizedWeight

__all__ = ["BackendMisbehaved", "CaseTimeout", "private_copy", "private_checkpoint", "checkpoint_pairs",
           "check_unmodified", "time_limit", "case_timeout", "guarded_call"]

# seconds a backend call may take before the case fails (override: MOE_CONFORMANCE_CASE_TIMEOUT or
# pytest --case-timeout); generous, since a first GPU call compiles its kernels
DEFAULT_CASE_TIMEOUT = {"cpu": 300.0, "gpu": 900.0}


class BackendMisbehaved(AssertionError):
    """A backend broke the protocol in a way that would corrupt other verdicts (it wrote into its inputs)."""


class CaseTimeout(AssertionError):
    """A backend call did not return within the case's time limit."""


def private_copy(t: torch.Tensor) -> torch.Tensor:
    """A copy with the same shape, strides and storage offset; a view keeps what lies around it in its
    storage (a buffer's padded rows past the real tokens stay poisoned)."""
    base = t._base if t._base is not None else t
    storage = base.clone()
    if t._base is None:
        return storage
    return storage.as_strided(t.size(), t.stride(), t.storage_offset() - base.storage_offset())


def _tensor_fields(ckpt: MoECheckpoint):
    for name in ("w13", "w2"):
        w: QuantizedWeight = getattr(ckpt, name)
        for part in ("data", "scale", "global_scale"):
            yield f"ckpt.{name}.{part}", getattr(w, part)
    for name in ("b13", "b2", "w13_input_scale", "w2_input_scale"):
        yield f"ckpt.{name}", getattr(ckpt, name)


def private_checkpoint(ckpt: MoECheckpoint) -> MoECheckpoint:
    """The checkpoint with every tensor copied."""
    return ckpt.map_tensors(torch.clone)


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is b
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.device != b.device:  # compared where they live: a real model's checkpoint on a GPU is GBs
        a, b = a.detach().cpu(), b.detach().cpu()
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)) if a.numel() else True


def checkpoint_pairs(original: MoECheckpoint, given: MoECheckpoint):
    """(name, pristine tensor, the backend's copy) for every checkpoint tensor."""
    return [(name, a, b) for (name, a), (_, b) in zip(_tensor_fields(original), _tensor_fields(given))]


def check_unmodified(what: str, call: str, pairs) -> None:
    """Raise BackendMisbehaved naming every (name, original, given) whose given copy was written."""
    changed = [name for name, a, b in pairs if not _same(a, b)]
    if changed:
        raise BackendMisbehaved(f"{what}: {call} modified {', '.join(changed)} in place (a backend must not write "
                                "into its inputs: the harness shares them between cases and backends)")


def case_timeout(is_gpu: bool) -> float:
    env = os.environ.get("MOE_CONFORMANCE_CASE_TIMEOUT")
    return float(env) if env else DEFAULT_CASE_TIMEOUT["gpu" if is_gpu else "cpu"]


@contextlib.contextmanager
def time_limit(seconds: float | None, what: str):
    """Fail with CaseTimeout if the body runs longer than `seconds` (SIGALRM: main thread, POSIX; a body
    stuck inside native code is interrupted when it next returns to Python). None or 0: no limit."""
    usable = (seconds and hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread())
    if not usable:
        yield
        return

    def expired(signum, frame):
        raise CaseTimeout(f"{what}: no result within the case time limit of {seconds:g} s "
                          "(set MOE_CONFORMANCE_CASE_TIMEOUT or pytest --case-timeout to change it)")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


_HUNG: dict[int, str] = {}  # id(backend) -> the timeout message: later calls fail at once (no re-hang)


def guarded_call(backend, what: str, call: str, fn, *args):
    """fn(*args) under the case time limit; a backend that hung once fails at once afterwards (Hypothesis
    would otherwise wait out the limit again for every example it shrinks)."""
    if id(backend) in _HUNG:
        raise CaseTimeout(f"{what}: {call} not run: {backend.name} hung before ({_HUNG[id(backend)]})")
    try:
        with time_limit(case_timeout(getattr(backend, "device", "cpu") != "cpu"), f"{what}: {call}"):
            return fn(*args)
    except CaseTimeout as exc:
        _HUNG[id(backend)] = str(exc)
        raise
    except Exception as exc:  # the backend's own error: say which case and call raised it (a traceback note)
        if hasattr(exc, "add_note"):
            exc.add_note(f"raised by {backend.name}'s {call} in case {what}")
        raise
