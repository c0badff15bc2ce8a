"""Which numerical structure a failing output conforms to (issue 26): the reference of every built-in structure
and of each single-field change of the declared one, each with its own derived bound. A kernel that is right but
declares the wrong structure is told what to declare; a kernel that fits none is told that too."""

from __future__ import annotations

import dataclasses

import torch

from harness.core.tolerances import compare, moe_error_bound
from reference.checkpoints import MoECheckpoint
from reference.moe import fused_moe
from reference.structure import (STRUCTURES, ActivationEval, NumericalStructure, Precision, RouterWeight, ScaleApply,
                                 TopKSum)

__all__ = ["candidate_structures", "conforming_structures", "structure_verdicts"]

# the fields a structure is made of, and their possible values
_FIELDS = {"gemm1_out": Precision, "act_out": Precision, "gemm2_out": Precision, "router_weight": RouterWeight,
           "activation": ActivationEval, "topk_sum": TopKSum, "fp8_static_scale": ScaleApply}


def candidate_structures(declared: NumericalStructure) -> list[tuple[str, NumericalStructure]]:
    """(how to declare it, structure): the built-in structures other than the declared one, then each change of
    one field of the declared one (an activation change applies to every activation: its per-activation rules
    are dropped)."""
    out = [(f"numerical_structure = {name!r}", st) for name, st in STRUCTURES.items() if st != declared]
    for field, kind in _FIELDS.items():
        for value in kind:
            if value == getattr(declared, field):
                continue
            extra = {"activation_rules": ()} if field == "activation" else {}
            label = f"dataclasses.replace(STRUCTURES[{declared.name!r}], {field}={kind.__name__}.{value.name})"
            variant = dataclasses.replace(declared, name=f"{declared.name}+{field}={value.value}",
                                          **{field: value}, **extra)
            if all(variant != st for _, st in out):
                out.append((label, variant))
    return out


def conforming_structures(got: torch.Tensor, ckpt: MoECheckpoint, inputs, declared: NumericalStructure,
                          declarations: dict) -> list[str]:
    """The declarations (candidate_structures' labels) whose reference and bound this output meets; declarations:
    the backend's GEMM declarations (harness.backends.backend_bound_declarations)."""
    x, w, ids = inputs
    fits = []
    for label, st in candidate_structures(declared):
        if st.max_top_k is not None and ids.shape[1] > st.max_top_k:
            continue
        out, trace = fused_moe(x, ckpt, w, ids, structure=st, trace=True)
        bound = moe_error_bound(trace, ckpt, **declarations).to("cpu")  # the reference may run on a GPU
        if compare(out.cpu(), got.cpu(), bound, label).ok:
            fits.append(label)
    return fits


def structure_verdicts(got: torch.Tensor, ckpt: MoECheckpoint, inputs, declared: NumericalStructure,
                       declarations: dict) -> dict[str, bool]:
    """{declaration: does the output conform} for the declared structure (its label: the declared name) and every
    candidate (python -m harness diagnose: the structures that fit every case)."""
    x, w, ids = inputs
    verdicts = {}
    for label, st in [(f"numerical_structure = {declared.name!r} (declared)", declared),
                      *candidate_structures(declared)]:
        if st.max_top_k is not None and ids.shape[1] > st.max_top_k:
            continue
        out, trace = fused_moe(x, ckpt, w, ids, structure=st, trace=True)
        bound = moe_error_bound(trace, ckpt, **declarations).to("cpu")
        verdicts[label] = compare(out.cpu(), got.cpu(), bound, label).ok
    return verdicts
