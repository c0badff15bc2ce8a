"""The Triton kernels' bit-level helpers (harness/backends/triton_kernels.py), run under the interpreter
on CPU and compiled on a GPU, on the bit patterns that hardware produces and numpy does not: NVIDIA's
canonical NaN is 0x7FFFFFFF, numpy's 0x7FC00000."""

from __future__ import annotations

import torch

from harness.backends import triton_kernels as K
from harness.backends.triton_kernels import tl, triton
from harness.platforms import default_device
from reference.moe import round_bf16 as reference_round_bf16


@triton.jit
def _round_bf16_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr + offs, K.round_bf16(x), mask=offs < n)


def test_round_bf16_rounds_like_torch_and_keeps_every_nan_a_nan():
    nan_bits = [0x7FFFFFFF, 0xFFFFFFFF, 0x7FC00000, 0x7F800001, 0xFFBFFFFF]
    other_bits = [0x7F800000, 0xFF800000, 0x7F7FFFFF, 0x00000001, 0x80000000, 0x3F808000, 0x3F818000, 0x3F80C000]
    bits = torch.tensor(nan_bits + other_bits, dtype=torch.int64).to(torch.int32)  # wraps to the same bits
    x = bits.view(torch.float32)
    x = torch.cat([x, torch.randn(64) * 10.0 ** torch.randint(-30, 30, (64,)).float()])
    device = default_device()
    out = torch.empty_like(x, device=device)
    _round_bf16_kernel[(1,)](x.to(device), out, x.numel(), BLOCK=128)
    out = out.cpu()
    n_nan = len(nan_bits)
    assert bool(torch.isnan(out[:n_nan]).all()), out[:n_nan].view(torch.int32).tolist()
    expected = reference_round_bf16(x[n_nan:].double()).float()
    assert torch.equal(out[n_nan:].view(torch.int32), expected.view(torch.int32))
