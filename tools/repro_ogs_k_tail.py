"""Is triton_kernels' MXFP4 matmul_ogs right when K is not a multiple of 64? (results/gpu-issue23/run-4/-5.)

One dense GEMM, no routing, no activation: x [M, K] bf16 times an MXFP4 weight [K, N] (the wheel's
matmul_ogs, Hopper value/scale layouts as vLLM builds them on sm90, split_k 1), against the exact product of the
same bf16 x and the dequantized weight (float64), in bf16 ulps of the exact value. A correct kernel with an fp32
accumulator and one rounding to bf16 stays within about 0.5 ulp plus the fp32 accumulation error. Run at K a
multiple of 64 (2880), at K = 32 mod 64 as given (1440), and at 1440 padded with zero codes to 1472 (what vLLM's
mxfp4_round_up_hidden_size_and_intermediate_size does for this backend).

    python3 tools/repro_ogs_k_tail.py      # on the GPU machine (carry .third_party); prints one line per case
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from harness.backends.triton_kernels_ogs import TritonKernelsOgs  # noqa: E402
from reference.checkpoints import QuantizedWeight  # noqa: E402
from reference.formats import E2M1  # noqa: E402
from reference.mx import dequantize_mx, quantize_mx  # noqa: E402
from reference.packing import pack_fp4  # noqa: E402


def _ulps(a: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    e = torch.floor(torch.log2(exact.abs().clamp_min(2.0**-100)))
    return (a.double() - exact).abs() / torch.exp2(e - 7)


def case(backend: TritonKernelsOgs, m: int, k: int, n: int, pad_to: int | None, seed: int = 0) -> str:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).bfloat16()
    w = torch.randn(n, k, generator=g)  # [N, K]: the checkpoint's layout, blocks along K
    q = quantize_mx(w, E2M1)
    exact = x.double() @ dequantize_mx(q.codes, q.scales, E2M1).double().T
    codes, scales = pack_fp4(q.codes), q.scales
    kk = k
    if pad_to is not None:
        codes = torch.nn.functional.pad(codes, (0, (pad_to - k) // 2))
        scales = torch.nn.functional.pad(scales, (0, (pad_to - k) // 32))
        x = torch.nn.functional.pad(x, (0, pad_to - k))
        kk = pad_to
    weight = QuantizedWeight(data=codes[None], scale=scales[None])
    wt, pc = backend._weight(weight, "w_mxfp4")
    tk = backend.kernels()
    # a one-expert weight [1, K, N] with a batch of one: matmul_ogs' batched mode (no routing)
    y = tk.matmul_ogs.matmul_ogs(x.cuda()[None], wt, None, None, precision_config=pc)
    y = y.reshape(m, n).cpu()
    err = _ulps(y, exact)
    bad = int((err > 1.0).sum())
    return (f"K={k:5d}{'' if pad_to is None else f' padded to {pad_to}'}: M={m} N={n}; worst {err.max():.1f} bf16 ulp "
            f"of exact, {bad} of {err.numel()} outputs beyond 1 ulp")


def main() -> int:
    backend = TritonKernelsOgs()
    for m in (8, 64):
        for k, pad in ((2880, None), (1440, None), (1440, 1472)):
            print(case(backend, m, k, 2880, pad), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
