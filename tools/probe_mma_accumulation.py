"""How a GPU's matrix unit rounds its fp32 accumulation (GEMM bound, issue 24 item 7): bf16 operands, fp32
accumulator (Triton tl.dot) and cuBLAS fp32 SGEMM, against float64, for random-sign and all-positive terms.
Round-to-nearest accumulation stays far inside the probabilistic term (harness.core.tolerances.gemm_relative_error);
a truncating accumulator's error grows like K u over all-positive terms and would break it.

    python3 tools/probe_mma_accumulation.py        # on a GPU host (compiled Triton)
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from harness.core.tolerances import U_FP32, gamma, gemm_relative_error  # noqa: E402


@triton.jit
def _dot_fp32_out(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pm, pn = tl.program_id(0), tl.program_id(1)
    rm = pm * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
        b = tl.load(b_ptr + rn[None, :] * K + (k + rk)[:, None])
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc)


def main() -> int:
    g = torch.Generator(device="cuda").manual_seed(0)
    print("| K | terms | kernel | max err / (u K sum|x|) | max err / probabilistic term | max err / gamma_K term |")
    print("|---|---|---|---|---|---|")
    for k in (512, 2880, 7168):
        for terms in ("random-sign", "all-positive"):
            a = torch.randn(128, k, device="cuda", generator=g)
            w = torch.randn(128, k, device="cuda", generator=g)
            if terms == "all-positive":
                a, w = a.abs(), w.abs()
            a, w = a.bfloat16(), w.bfloat16()
            exact = a.double() @ w.double().T
            s1 = a.double().abs() @ w.double().abs().T
            c = torch.empty(128, 128, device="cuda")
            _dot_fp32_out[(2, 2)](a, w, c, 128, 128, k, BLOCK_M=64, BLOCK_N=64, BLOCK_K=64)
            torch.backends.cuda.matmul.allow_tf32 = False
            sgemm = a.float() @ w.float().T
            for name, got in (("triton tl.dot bf16", c), ("cuBLAS fp32 SGEMM", sgemm)):
                err = (got.double() - exact).abs()
                row = [k, terms, name, float((err / (U_FP32 * k * s1)).max()),
                       float((err / (gemm_relative_error(k, 0.0) * s1)).max()),
                       float((err / (gamma(k + 4) * s1)).max())]
                print("| " + " | ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in row) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
