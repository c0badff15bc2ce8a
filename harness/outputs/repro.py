"""Reproducers a kernel engineer can attach to a bug report (`pytest --repro DIR`).

For a failing conformance case, write DIR/<case>/case.pt (the checkpoint, the inputs, the reference
output, the per-element bound, the numerical structure and the backend spec) and DIR/<case>/repro.py, a
short script that loads them, runs the backend's prepare() and forward(), and repeats the comparison. The
case is first shrunk: to the one token whose output fails alone (the smallest that still fails), then to
the experts that token is routed to (their static input scales pinned to the original max over experts,
so the activation quantization does not change).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import torch

from reference.checkpoints import MoECheckpoint, QuantizedWeight
from reference.moe import fused_moe

from harness.backends import backend_bound_declarations, backend_structure
from harness.core.tolerances import compare, moe_error_bound
from harness.core.conformance import backend_shape, case_problem, reference_run

__all__ = ["shrink_case", "write_repro", "write_case_repro", "expert_subset"]


def expert_subset(ckpt: MoECheckpoint, experts: list[int]) -> MoECheckpoint:
    """The checkpoint of these experts only (in this order); static input scales all set to the original
    max over experts, so that the MoE's activation scales are unchanged."""
    idx = torch.tensor(experts, dtype=torch.long)

    def pick(w: QuantizedWeight) -> QuantizedWeight:
        return dataclasses.replace(
            w, data=w.data[idx], scale=None if w.scale is None else w.scale[idx],
            global_scale=None if w.global_scale is None else w.global_scale[idx])

    def pinned(s):
        return None if s is None else _pinned_max(s, len(experts))

    return dataclasses.replace(
        ckpt, w13=pick(ckpt.w13), w2=pick(ckpt.w2),
        b13=None if ckpt.b13 is None else ckpt.b13[idx], b2=None if ckpt.b2 is None else ckpt.b2[idx],
        w13_input_scale=pinned(ckpt.w13_input_scale), w2_input_scale=pinned(ckpt.w2_input_scale))


def _pinned_max(scale: torch.Tensor, n: int) -> torch.Tensor:
    # the max over experts in the direction the checkpoint stores (NVFP4 "encode" stores 1/s: its min)
    if scale.numel() and bool((scale > 0).all()):
        return torch.full((n,), float(scale.amax()), dtype=scale.dtype)
    return scale[:n]


def _run(backend, ckpt, x, w, ids):
    structure = backend_structure(backend)
    out, trace = fused_moe(x, ckpt, w, ids, structure=structure, trace=True)
    device = getattr(backend, "device", "cpu")
    got = backend.forward(backend.prepare(ckpt), x.to(device), w.to(device), ids.to(device)).cpu()
    bound = moe_error_bound(trace, ckpt, **backend_bound_declarations(backend, ckpt.scheme.name))
    return out, got, bound


def shrink_case(backend, ckpt: MoECheckpoint, x, w, ids):
    """(ckpt, x, w, ids) of a smaller failing case, or the originals when nothing smaller fails."""
    if ckpt.w13_input_scale is not None and ckpt.nvfp4_global_convention == "encode":
        return ckpt, x, w, ids  # pinning the max would need the decode direction: keep the whole case
    for t in range(x.shape[0]):
        one = (x[t : t + 1], w[t : t + 1], ids[t : t + 1])
        try:
            out, got, bound = _run(backend, ckpt, *one)
        except Exception:  # noqa: BLE001 - a crash on the smaller case is not the failure being shrunk
            continue
        if compare(out, got, bound, "shrink").ok:
            continue
        experts = ids[t].tolist()
        small = expert_subset(ckpt, experts)
        remapped = torch.arange(len(experts), dtype=ids.dtype)[None, :]
        try:
            out, got, bound = _run(backend, small, one[0], one[1], remapped)
            if not compare(out, got, bound, "shrink").ok:
                return small, one[0], one[1], remapped
        except Exception:  # noqa: BLE001
            pass
        return (ckpt, *one)
    return ckpt, x, w, ids


_SCRIPT = '''"""Reproduce {case_id}: python repro.py [module:factory], run where the backend imports (the
working directory is put on sys.path, as pytest's rootdir is). Default backend: {spec!r}.
Shrunk to {tokens} token(s) and {experts} expert(s). Exit status 1 while it still fails."""
import os
import pathlib
import sys

sys.path.insert(0, os.getcwd())

import torch

from harness.backends import load_backend
from harness.core.tolerances import ErrorBound, compare

case = torch.load(pathlib.Path(__file__).with_name("case.pt"), weights_only=False)
backend = load_backend(sys.argv[1] if len(sys.argv) > 1 else case["backend"])
device = getattr(backend, "device", "cpu")
got = backend.forward(backend.prepare(case["checkpoint"]), *(t.to(device) for t in case["inputs"])).cpu()
result = compare(case["expected"], got, ErrorBound(case["bound"]), case["case_id"], structure=case["structure"],
                 exact=case["exact"])
print(result.message())
sys.exit(0 if result.ok else 1)
'''


def write_repro(out_dir: Path | str, spec: str, case_id: str, backend, ckpt, inputs) -> Path:
    """Shrink the case, write case.pt and repro.py under out_dir/<case id>, return that folder."""
    x, w, ids = inputs
    ckpt, x, w, ids = shrink_case(backend, ckpt, x, w, ids)
    structure = backend_structure(backend)
    out, got, bound = _run(backend, ckpt, x, w, ids)
    exact = fused_moe(x, ckpt, w, ids, structure=structure, exact=True)
    folder = Path(out_dir) / re.sub(r"[^A-Za-z0-9_.-]+", "_", case_id)
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(dict(case_id=case_id, backend=spec, structure=structure.label, checkpoint=ckpt, inputs=(x, w, ids),
                    expected=out, bound=bound.bound, exact=exact), folder / "case.pt")
    (folder / "repro.py").write_text(_SCRIPT.format(case_id=case_id, spec=spec, tokens=x.shape[0],
                                                    experts=ckpt.num_experts))
    return folder


def write_case_repro(out_dir: Path | str, spec: str, backend, case, shape) -> Path:
    """write_repro for a conformance case (harness.core.conformance.ConformanceCase) at `shape`."""
    problem, _, _ = case_problem(backend, case.scheme, case.activation, case.platform, shape)
    ckpt, inputs, _, _ = reference_run(case.scheme.name, case.activation.name, case.platform.fp8_format.name,
                                       backend_shape(backend, shape), 0, backend_structure(backend), problem.has_bias)
    return write_repro(out_dir, spec, case.id, backend, ckpt, inputs)
