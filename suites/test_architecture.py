"""The house's rooms: reference/ imports only torch (and itself); harness/'s sub-packages are layered and
no module imports from a room above its own, at module level or inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# lowest first: a module may import from its own layer and below
LAYERS = (
    ("reference",),
    ("harness.platforms", "harness.inputs", "harness.third_party"),
    ("harness.backends", "harness.peers"),
    ("harness.core",),
    ("harness.detection", "harness.bench", "harness.parallel"),
    ("harness.outputs", "harness.__main__"),
)


def _layer(module: str) -> int | None:
    for i, rooms in enumerate(LAYERS):
        if any(module == r or module.startswith(r + ".") for r in rooms):
            return i
    return None


def _modules():
    for path in sorted((ROOT / "reference").rglob("*.py")) + sorted((ROOT / "harness").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield name, path


def _imports(name: str, path: Path):
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                yield ".".join(base + ([node.module] if node.module else []))
            else:
                yield node.module


def test_every_module_belongs_to_a_room():
    unplaced = [name for name, _ in _modules() if _layer(name) is None and name != "harness"]
    assert not unplaced, unplaced


def test_no_module_imports_from_a_room_above_its_own():
    upward = []
    for name, path in _modules():
        mine = _layer(name)
        for target in _imports(name, path):
            theirs = _layer(target) if target and target.split(".")[0] in ("reference", "harness") else None
            if mine is not None and theirs is not None and theirs > mine:
                upward.append(f"{name} (layer {mine}) imports {target} (layer {theirs})")
    assert not upward, "\n".join(upward)


def test_the_reference_imports_only_torch_and_itself():
    foreign = {target for name, path in _modules() if name.startswith("reference")
               for target in _imports(name, path) if target and target.split(".")[0] not in
               ("reference", "torch", "__future__", "dataclasses", "enum", "typing", "functools", "math", "itertools")}
    assert not foreign, foreign
