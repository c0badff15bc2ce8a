"""Backend registry: name -> "module:factory", imported lazily. Adding a backend is one module plus one
line here. Outside backends come from `pytest --backend module:factory` or the entry-point group
`moe_conformance.backends` (name = "module:factory")."""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from .base import (Backend, Declined, Problem, backend_accumulation_error, backend_available, backend_operand_dtype,
                   backend_prepare, backend_structure)

__all__ = ["BUILTIN_BACKENDS", "ENTRY_POINT_GROUP", "load_backend", "registered_backends", "Backend", "Problem",
           "backend_available", "backend_operand_dtype", "backend_accumulation_error", "backend_structure",
           "backend_prepare", "Declined"]

BUILTIN_BACKENDS: dict[str, str] = {
    "triton_emulation": "harness.backends.triton_emulation:make_backend",
    "triton_dot_scaled": "harness.backends.triton_dot_scaled:make_backend",
    "torch_fp8": "harness.backends.torch_fp8:make_backend",
    "torch_blockscaled": "harness.backends.torch_blockscaled:make_backend",
    "torch_emulation": "harness.backends.torch_emulation:make_backend",
    "aiter": "harness.backends.aiter_model:make_backend",
}
ENTRY_POINT_GROUP = "moe_conformance.backends"


def load_backend(spec: str):
    """A backend from a registered name or a "module:factory" path (the factory is called with no args)."""
    target = BUILTIN_BACKENDS.get(spec, spec)
    if ":" not in target:
        raise ValueError(f"unknown backend {spec!r}: not one of {sorted(BUILTIN_BACKENDS)} and not 'module:factory'")
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"backend {spec!r}: cannot import {module_name!r} ({exc})") from exc
    factory = getattr(module, attr, None)
    if factory is None:
        raise ValueError(f"backend {spec!r}: module {module_name!r} has no {attr!r}")
    backend = factory()
    missing = [m for m in ("name", "supports", "prepare", "forward") if not hasattr(backend, m)]
    if missing:
        raise TypeError(f"backend {spec!r} does not implement the protocol: missing {missing}")
    return backend


def registered_backends(extra: list[str] | None = None) -> dict[str, object]:
    """Built-ins, then entry points, then `extra` specs; later entries replace earlier ones by name."""
    specs = list(BUILTIN_BACKENDS.values())
    specs += [ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)]
    specs += list(extra or [])
    out = {}
    for spec in specs:
        backend = load_backend(spec)
        out[backend.name] = backend
    return out
