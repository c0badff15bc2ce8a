"""moe-conformance's harness. On a machine without a GPU, Triton kernels run under the interpreter, and
TRITON_INTERPRET=1 must be set before any kernel is defined: it is set here, on the first import of the package,
so that every entry point (python -m harness, a script calling harness.core.conformance.run_case, pytest) works
with no environment set beforehand."""

import os as _os

from harness.platforms import has_gpu as _has_gpu

if not _has_gpu():
    _os.environ.setdefault("TRITON_INTERPRET", "1")
