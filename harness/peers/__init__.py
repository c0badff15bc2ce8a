"""Adapters to well-known libraries whose quantizers are cross-checked against the reference."""

from __future__ import annotations


def installed(distribution: str, extra: str) -> tuple[bool, str]:
    """(True, its version) if the pinned distribution is installed, else (False, why): found through its metadata,
    never imported (ModelOpt's and compressed-tensors' imports take seconds)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return True, version(distribution)
    except PackageNotFoundError:
        return False, f"{distribution} is not installed (the `{extra}` extra; make test installs it)"
