"""jax_ragged_dot: the bf16 MoE with both grouped GEMMs done by XLA's ragged dot (jax.lax.ragged_dot,
how JAX models such as MaxText run their experts), a kernel family we did not write and that torch does not
share. The tensors cross between torch and JAX by DLPack without copies (the weights are laid out [E, K, N]
once in prepare()); the glue around the GEMMs (grouping,
activation, weighted top-k sum) is torch_grouped_mm's, so a difference between the two backends is a
difference of their GEMMs. Declared structure: rounded_terms (each ragged dot returns bf16, its fp32
accumulator rounded once; XLA's choice, which the suite checks).

The two runtimes do not share CUDA streams: the torch stream is synchronised before JAX reads a tensor and
JAX's result is waited for before torch reads it, so the launch is not CUDA-graph capturable (the benchmark
times it eagerly)."""

from __future__ import annotations

import os

import torch

from reference.checkpoints import MoECheckpoint

from .torch_grouped_mm import TorchGroupedMMBackend

__all__ = ["JaxRaggedDotBackend", "make_backend"]



def _jax():
    """jax, imported on first use (1.5 s: not paid by every pytest process that merely lists the backends),
    or None with why."""
    if "module" not in _JAX:
        # JAX would otherwise take 75% of the GPU's memory at start-up, and keep what it freed in its own pool,
        # beside torch's checkpoint and allocator (the H200 run of 2026-12-01 ran torch out of memory after it)
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        os.environ.setdefault("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")
        try:
            import jax

            _JAX.update(module=jax, error="")
        except Exception as exc:  # not installed, or a jaxlib that does not load here
            _JAX.update(module=None, error=f"jax is not importable here ({type(exc).__name__}: {exc})")
    return _JAX["module"]


_JAX: dict = {}


def _ragged_dot(a, w_kn, group_sizes, out_dtype):
    """rows of a [M, K] against their group's weight [E, K, N], out_dtype ("float32" or "bfloat16") out."""
    jax = _jax()
    return jax.lax.ragged_dot(a, w_kn, group_sizes, preferred_element_type=jax.numpy.dtype(out_dtype))


_JITTED = {}


class JaxRaggedDotBackend(TorchGroupedMMBackend):
    name = "jax_ragged_dot"
    graph_capturable = False  # JAX's stream is not torch's (see the module docstring)

    def __init__(self, device: str | None = None, out_dtype: str = "float32"):
        super().__init__(device)
        # float32: XLA returns its fp32 accumulator and torch rounds it to bf16 once (the declared structure).
        # "bfloat16" (what ragged_dot returns for bf16 operands by default) rounds more than once on the H200
        # at small M (README, "What the suites found"; tools/repro_jax_ragged_dot.py)
        self.out_dtype = out_dtype

    def supports(self, problem, platform) -> tuple[bool, str]:
        if problem.scheme.weight is not None or problem.scheme.act is not None:
            return False, "jax.lax.ragged_dot path: the bf16 MoE (scheme bf16) only"
        return self._common_supports(problem)

    def device_bytes(self, problem) -> int:
        """XLA's GEMM autotuner runs the candidates on fresh copies of the operands: the largest is GEMM1's stacked
        weights, [E, H, 2I] bf16, inside XLA's redzones (8 MiB each side by default). Kimi-K2 at TP 1: 22565355520
        bytes asked for, and refused, on the H200 in results/gpu-issue25/run-8, which is this to the byte."""
        gate = 2 if problem.activation.gated else 1
        return problem.num_experts * gate * problem.intermediate_size * problem.hidden_size * 2 + 2 * 8 * 2**20

    def available(self, platform) -> tuple[bool, str]:
        jax = _jax()
        if jax is None:
            return False, _JAX["error"]
        want = "gpu" if str(self.device).startswith("cuda") else "cpu"
        if not any(d.platform == want for d in jax.devices()):
            return False, f"jax {jax.__version__} sees no {want} device here ({jax.devices()})"
        return True, ""

    def prepare(self, ckpt: MoECheckpoint):
        dev = self.device
        sync = torch.cuda.synchronize if str(dev).startswith("cuda") else (lambda: None)
        # [E, K, N], once: handed the checkpoint's [E, N, K], XLA transposed all experts' weights in every call
        # (29 ms at one token on Kimi-K2 on the H200, the time of a 34 GB read and write)
        w13, w2 = (getattr(ckpt, n).data.to(dev).transpose(-2, -1).contiguous() for n in ("w13", "w2"))
        sync()
        jax = _jax()
        return dict(ckpt=ckpt, w13=jax.dlpack.from_dlpack(w13), w2=jax.dlpack.from_dlpack(w2), torch_weights=(w13, w2),
                    sync=sync)

    def _gemm(self, prep, name, a, groups):
        jax = _jax()
        if self.out_dtype not in _JITTED:
            _JITTED[self.out_dtype] = jax.jit(_ragged_dot, static_argnums=3)
        sizes = torch.diff(groups.offsets, prepend=groups.offsets.new_zeros(1))
        a = a.to(torch.bfloat16).contiguous()
        prep["sync"]()  # JAX reads on its own stream
        out = _JITTED[self.out_dtype](jax.dlpack.from_dlpack(a), prep[name], jax.dlpack.from_dlpack(sizes.contiguous()),
                                      self.out_dtype)
        out.block_until_ready()  # torch reads on its own stream
        return torch.from_dlpack(out).to(torch.bfloat16)


def make_backend() -> JaxRaggedDotBackend:
    return JaxRaggedDotBackend()
