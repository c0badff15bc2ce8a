"""run-20's conformance backend (`--backend prefill_backends:emulation_prefill` with this directory on PYTHONPATH):
triton_emulation with the bf16 prefill row of this commit (tma 2, 4 stages, GEMM2 at 256 columns) fixed at every
size, so that the conformance suites' small shapes run the prefill K loops and GEMM2's 256-column TMA box."""
from harness.backends import load_backend

BF16 = dict(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=4, group_m=8, tma=2, w2_block_n=256)


def emulation_prefill():
    return load_backend("triton_emulation").configure(**BF16)
