"""Dispatch as data: per platform, the first backend in its priority list that supports the problem.

An explicit choice never falls back silently: it is used if it supports the problem, else a clear
error. When nothing fits, the error names every candidate and its reason. The table of decisions for
every platform x scheme x activation is checked in (harness/data/oracle_table.txt) and tested, so a
dispatch change shows up in review; regenerate it with `python -m harness oracle --all --write`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from reference.activations import ACTIVATIONS
from reference.schemes import SCHEMES

from harness.backends import Problem, backend_available, checked_supports
from harness.platforms import PLATFORMS, Platform

__all__ = ["NoBackendError", "Decision", "choose_backend", "oracle_rows", "format_oracle_table", "ORACLE_TABLE_PATH"]

ORACLE_TABLE_PATH = Path(__file__).parents[1] / "data" / "oracle_table.txt"


class NoBackendError(RuntimeError):
    pass


@dataclass(frozen=True)
class Decision:
    backend: str | None
    candidates: tuple[tuple[str, bool, str], ...]  # (name, ok, reason) in priority order

    def explain(self) -> str:
        return "; ".join(f"{name}: {'ok' if ok else reason}" for name, ok, reason in self.candidates)


def _verdict(backend, problem: Problem, platform: Platform, require_available: bool) -> tuple[bool, str]:
    try:
        ok, reason = checked_supports(backend, problem, platform)
    except Exception as exc:  # noqa: BLE001 - a broken backend is skipped with its error, never crashes dispatch
        return False, f"supports() failed: {type(exc).__name__}: {exc}"
    if ok and require_available:
        ok, reason = backend_available(backend, platform)
    return ok, reason


def choose_backend(
    problem: Problem,
    platform: Platform,
    backends: dict[str, object],
    explicit: str | None = None,
    require_available: bool = False,
) -> Decision:
    """The oracle. require_available=False answers "what would run on that platform" (the table);
    True also requires the backend to be runnable on this host now (runtime dispatch)."""
    if explicit is not None:
        if explicit not in backends:
            raise NoBackendError(f"backend {explicit!r} was requested but is not registered ({sorted(backends)})")
        ok, reason = _verdict(backends[explicit], problem, platform, require_available)
        if not ok:
            raise NoBackendError(
                f"backend {explicit!r} was requested for {problem.label} on {platform.name} but: {reason} "
                "(an explicit choice never falls back)"
            )
        return Decision(explicit, ((explicit, True, reason),))
    candidates = []
    for name in platform.backend_priority:
        if name not in backends:
            candidates.append((name, False, "not registered"))
            continue
        ok, reason = _verdict(backends[name], problem, platform, require_available)
        candidates.append((name, ok, reason))
        if ok:
            return Decision(name, tuple(candidates))
    detail = "; ".join(f"{n}: {r}" for n, _, r in candidates)
    raise NoBackendError(f"no backend for {problem.label} on {platform.name}: {detail}")


def oracle_rows(platform: Platform, backends: dict[str, object], schemes=None, activations=None):
    """(scheme, activation, backend or None, why) for every scheme x activation on a platform (or only
    the named schemes / activations)."""
    for scheme in SCHEMES.values():
        if schemes and scheme.name not in schemes:
            continue
        for act in ACTIVATIONS.values():
            if activations and act.name not in activations:
                continue
            problem = Problem(scheme, act)
            try:
                d = choose_backend(problem, platform, backends)
                skipped = [f"{n} ({r})" for n, ok, r in d.candidates if not ok and r != "not registered"]
                yield scheme.name, act.name, d.backend, "; ".join(skipped)
            except NoBackendError as exc:
                yield scheme.name, act.name, None, str(exc)


def format_oracle_table(platforms: list[Platform], backends: dict[str, object], schemes=None,
                        activations=None) -> str:
    """The dispatch table; a chosen backend that is only a capability model (it answers supports() for
    dispatch but has no adapter that runs) is marked as such."""
    lines = ["# platform scheme activation -> backend  [skipped candidates: reason]"]
    for p in platforms:
        for scheme, act, chosen, why in oracle_rows(p, backends, schemes, activations):
            tail = f"  [{why}]" if why else ""
            model = " (capability model: does not run)" if getattr(backends.get(chosen), "capability_model", False) else ""
            lines.append(f"{p.name:<7} {scheme:<26} {act:<17} -> {chosen or 'NONE'}{model}{tail}")
    return "\n".join(lines) + "\n"


def all_platforms() -> list[Platform]:
    return list(PLATFORMS.values())
