"""run-20's second call (`--backend fp4_backends:bitplace_wide` with this directory on PYTHONPATH): triton_bitplace
with 128 weight rows a program on two warpgroups (block_n 128, 8 warps) at 128 activation rows with 64-row tails,
fixed at every size, so that the conformance suites' small shapes run that prefill loop."""
from harness.backends import load_backend

WIDE = dict(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=3, group_m=8, tail_m=64)


def bitplace_wide():
    return load_backend("triton_bitplace").configure(**WIDE)
