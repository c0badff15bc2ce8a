"""The simple example backend declaring a numerical structure it does not follow: it says "vllm_triton"
(the router weight inside GEMM2's epilogue, a sequential bf16 top-k sum, the gate function rounded before
the multiply) but computes "rounded_terms". Most cases fail by one or two bf16 ulps on a tenth of the
elements, and the message names the structure the reference assumed:

    .venv/bin/python -m pytest suites/test_conformance.py --backend examples.wrong_structure_backend:make_backend
"""

from examples.simple_backend import SimpleBackend


class WrongStructureBackend(SimpleBackend):
    name = "wrong_structure_example"
    numerical_structure = "vllm_triton"


def make_backend():
    return WrongStructureBackend()
