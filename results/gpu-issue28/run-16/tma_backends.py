"""The two prefill-by-TMA backends of run-16's conformance check (`--backend tma_backends:emulation_tma` with this
directory on PYTHONPATH): the built-in backends with the prefill tiles and tma 1 fixed at every size, so that the
conformance suites' small shapes run the TMA K loops (tiles' tma 1 falls back to the plain loads where K % 8 != 0)."""
from harness.backends import load_backend

BF16 = dict(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=4, group_m=8, tma=1)
FP4 = dict(block_m=64, block_n=64, block_k=128, num_warps=4, num_stages=3, group_m=8, tma=1)


def emulation_tma():
    return load_backend("triton_emulation").configure(**BF16)


def bitplace_tma():
    return load_backend("triton_bitplace").configure(**FP4)
