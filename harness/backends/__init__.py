"""Backend registry: name -> "module:factory", imported lazily. Adding a backend is one module plus one
line here. Outside backends come from `pytest --backend module:factory` or the entry-point group
`moe_conformance.backends` (name = "module:factory")."""

from __future__ import annotations

import importlib
import re
from importlib.metadata import entry_points

from .base import (Backend, Declined, Problem, backend_accumulation_error, backend_accumulation_truncation,
                   backend_available, backend_bound_declarations,
                   backend_intermediate_multiple, backend_device_bytes, backend_k_order, backend_operand_dtype,
                   backend_known_failures, backend_prepare, backend_structure, checked_supports, KnownFailure,
                   known_failure_for)

__all__ = ["BUILTIN_BACKENDS", "BACKEND_NAME", "ENTRY_POINT_GROUP", "load_backend", "registered_backends", "Backend", "Problem",
           "backend_available", "backend_operand_dtype", "backend_accumulation_error", "backend_k_order",
           "backend_accumulation_truncation",
           "backend_bound_declarations", "backend_structure",
           "backend_prepare", "Declined", "checked_supports", "KnownFailure", "backend_known_failures", "known_failure_for",
           "backend_intermediate_multiple", "backend_device_bytes"]

BUILTIN_BACKENDS: dict[str, str] = {
    "triton_emulation": "harness.backends.triton_emulation:make_backend",
    "triton_dot_scaled": "harness.backends.triton_dot_scaled:make_backend",
    "torch_fp8": "harness.backends.torch_fp8:make_backend",
    "torch_blockscaled": "harness.backends.torch_blockscaled:make_backend",
    "torch_emulation": "harness.backends.torch_emulation:make_backend",
    "aiter": "harness.backends.aiter_model:make_backend",
    "dequantize_all": "harness.backends.dequantize_all:make_backend",
    "torch_grouped_mm": "harness.backends.torch_grouped_mm:make_bf16_backend",
    "torch_scaled_grouped_mm": "harness.backends.torch_grouped_mm:make_fp8_backend",
    "jax_ragged_dot": "harness.backends.jax_ragged_dot:make_backend",
    "triton_bitplace": "harness.backends.triton_bitplace:make_backend",
    "triton_bitplace_gluon": "harness.backends.triton_bitplace:make_gluon_backend",
    "triton_kernels_ogs": "harness.backends.triton_kernels_ogs:make_backend",
    "vllm_fused_moe@0.33.0": "harness.backends.vllm_fused_moe:make_release_0_33_0",
    "vllm_fused_moe@0.13.0": "harness.backends.vllm_fused_moe:make_release_0_13_0",
}
ENTRY_POINT_GROUP = "moe_conformance.backends"


BACKEND_NAME = re.compile(r"[A-Za-z0-9_.@+-]+")


def load_backend(spec: str):
    """A backend from a registered name or a "module:factory" path (the factory is called with no args).
    Every way this can go wrong is one error naming the spec, what was found and what was expected."""
    if not isinstance(spec, str):
        raise TypeError(f"a backend spec must be a str (a registered name or 'module:factory'), got {spec!r}")
    target = BUILTIN_BACKENDS.get(spec, spec)
    if ":" not in target:
        raise ValueError(f"unknown backend {spec!r}: not one of the registered {sorted(BUILTIN_BACKENDS)} and "
                         "not 'module:factory'")
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"backend {spec!r}: cannot import {module_name!r} ({type(exc).__name__}: {exc}); is its "
                         "directory on PYTHONPATH (or the directory you run pytest from), or is its package "
                         "installed?") from None
    factory = getattr(module, attr, None)
    if factory is None:
        raise ValueError(f"backend {spec!r}: module {module_name!r} has no {attr!r}")
    if not callable(factory):
        raise TypeError(f"backend {spec!r}: {module_name}.{attr} is a {type(factory).__name__}, not a factory; "
                        "expected a function (or class) that returns a backend instance")
    backend = factory()
    if isinstance(backend, type):
        raise TypeError(f"backend {spec!r}: the factory returned the class {backend.__name__}, not an instance; "
                        f"return {backend.__name__}() from it")
    missing = [m for m in ("name", "supports", "prepare", "forward") if not hasattr(backend, m)]
    if missing:
        raise TypeError(f"backend {spec!r} does not implement the protocol: missing {missing}")
    not_callable = [m for m in ("supports", "prepare", "forward") if not callable(getattr(backend, m))]
    if not_callable:
        raise TypeError(f"backend {spec!r}: {not_callable} must be methods")
    name = backend.name
    if not isinstance(name, str) or not BACKEND_NAME.fullmatch(name):
        raise ValueError(f"backend {spec!r}: name {name!r} must be a non-empty str of letters, digits and _ . @ + - "
                         "(it is part of every case id, scheme/activation/backend/platform)")
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
