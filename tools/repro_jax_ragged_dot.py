"""Does XLA's ragged dot round a bf16 product once? (README, "What the suites found".)

Part 1, JAX alone, no harness: bf16 operands, one group, M rows; ragged_dot's bf16 result against its own fp32
result rounded once to bf16, and both against the exact (float64) product: a correct kernel's bf16 result is
within 0.5 ulp of exact and equals the rounded fp32 one except where the fp32 accumulation order moves a tie.
Part 2, the harness: the jax_ragged_dot backend with out_dtype bfloat16 and float32 on conformance cases at
the GPU shape (1, 8 and 64 tokens, top_k 1 and 4), counting the cases out of bound.

    python3 tools/repro_jax_ragged_dot.py        # on the GPU machine; writes repro_jax_ragged_dot.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from harness.backends.jax_ragged_dot import JaxRaggedDotBackend, _jax  # noqa: E402
from harness.bench.report import write_results_json  # noqa: E402
from harness.core.conformance import SHAPES, run_drawn_case  # noqa: E402
from harness.platforms import detect_platform  # noqa: E402


def _ulps(a: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """|a - exact| in bf16 ulps of exact (ulp = 2^(floor(log2|exact|) - 7))."""
    e = torch.floor(torch.log2(exact.abs().clamp_min(2.0**-100)))
    return (a.double() - exact).abs() / torch.exp2(e - 7)


def jax_alone(rows: int, k: int = 512, n: int = 512, seed: int = 0) -> dict:
    jax = _jax()
    jnp = jax.numpy

    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, k, generator=g) * 2).bfloat16()
    w = (torch.randn(1, k, n, generator=g) * 0.05).bfloat16()
    dev = jax.devices()[0]
    xj, wj = jax.device_put(jnp.asarray(x.float().numpy()).astype(jnp.bfloat16), dev), jax.device_put(
        jnp.asarray(w.float().numpy()).astype(jnp.bfloat16), dev)
    sizes = jax.device_put(jnp.array([rows], dtype=jnp.int32), dev)
    out16 = torch.from_numpy(np.array(jax.lax.ragged_dot(xj, wj, sizes).astype(jnp.float32)))
    out32 = torch.from_numpy(np.array(jax.lax.ragged_dot(xj, wj, sizes, preferred_element_type=jnp.float32)))
    exact = x.double() @ w[0].double()
    once = out32.bfloat16().double()
    u16, u_once = _ulps(out16, exact), _ulps(once, exact)
    return dict(rows=rows, k=k, n=n, bf16_out_differs_from_fp32_rounded_once=int((out16.double() != once).sum()),
                bf16_out_worst_ulps_from_exact=float(u16.max()), fp32_rounded_once_worst_ulps_from_exact=float(u_once.max()),
                bf16_out_elements_over_half_ulp=int((u16 > 0.5 + 2.0**-10).sum()), elements=rows * n)


def harness_cases(out_dtype: str) -> dict:
    backend = JaxRaggedDotBackend(out_dtype=out_dtype)
    platform = detect_platform()
    failed, ran, first = 0, 0, ""
    for tokens in (1, 8, 64):
        for top_k in (1, 4):
            for routing in ("all_to_one", "random"):
                for seed in range(4):
                    r = run_drawn_case(backend, "bf16", "SILU", platform, SHAPES["gpu"], seed, tokens, top_k, routing)
                    if isinstance(r, str):
                        continue
                    ran += 1
                    if not r.ok:
                        failed += 1
                        first = first or r.message().splitlines()[0]
    return dict(out_dtype=out_dtype, cases=ran, failed=failed, first_failure=first)


def main() -> int:
    jax = _jax()
    print(f"jax {jax.__version__} on {jax.devices()}")
    rows = [dict(part="jax_alone", **jax_alone(m)) for m in (1, 2, 8, 64)]
    rows += [dict(part="harness", **harness_cases(d)) for d in ("bfloat16", "float32")]
    for r in rows:
        print(json.dumps(r), flush=True)
    write_results_json("repro_jax_ragged_dot.json", dict(rows=rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
