"""What torch's grouped GEMMs and torchao's GPU quantizers do on this GPU (issue 16): signatures, layout
and alignment rules, output dtype, whether torchao's kernels load. Prints one JSON line per probe and writes
probe_grouped_mm.json ($OUT, else results/). Run on the GPU machine:
    python3 tools/probe_grouped_mm.py
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness.bench.report import write_results_json  # noqa: E402

ROWS = []


def probe(name):
    def wrap(fn):
        try:
            row = dict(probe=name, ok=True, **(fn() or {}))
        except Exception as exc:  # the probe's point: record what fails and how
            row = dict(probe=name, ok=False, error=f"{type(exc).__name__}: {str(exc)[:400]}",
                       where=traceback.format_exc().splitlines()[-3][:200])
        ROWS.append(row)
        print(json.dumps(row), flush=True)
        return fn
    return wrap


dev = "cuda"
g = torch.Generator(device=dev).manual_seed(0)
E, K, N = 4, 256, 128
offs_aligned = torch.tensor([16, 48, 48, 96], dtype=torch.int32, device=dev)  # expert 2 gets no rows
offs_ragged = torch.tensor([5, 40, 40, 96], dtype=torch.int32, device=dev)


def ref_grouped(a, b, offs):
    out, start = [], 0
    for e, end in enumerate(offs.tolist()):
        out.append(a[start:end].float() @ b[e].float())
        start = end
    return torch.cat(out)


@probe("env")
def _():
    return dict(torch=torch.__version__, cuda=torch.version.cuda, device=torch.cuda.get_device_name(),
                cap=list(torch.cuda.get_device_capability()),
                grouped_mm_schema=str(torch.ops.aten._grouped_mm.default._schema),
                scaled_grouped_mm_schema=str(torch.ops.aten._scaled_grouped_mm.default._schema),
                public_scaled_grouped_mm=hasattr(torch.nn.functional, "scaled_grouped_mm"))


for label, offs in (("aligned", offs_aligned), ("ragged", offs_ragged)):
    @probe(f"grouped_mm_bf16_{label}")
    def _(offs=offs):
        a = torch.randn(96, K, device=dev, generator=g).bfloat16()
        b = torch.randn(E, N, K, device=dev, generator=g).bfloat16().transpose(-2, -1)  # [E, K, N], K-major
        out = torch._grouped_mm(a, b, offs=offs)
        ref = ref_grouped(a, b, offs)
        exact_rounded = torch.equal(out, ref.bfloat16())
        return dict(dtype=str(out.dtype), shape=list(out.shape), equals_fp32_ref_rounded_once=exact_rounded,
                    max_abs_diff=float((out.float() - ref).abs().max()))

    @probe(f"scaled_grouped_mm_fp8_{label}")
    def _(offs=offs):
        a = (torch.randn(96, K, device=dev, generator=g) * 4).to(torch.float8_e4m3fn)
        b = (torch.randn(E, N, K, device=dev, generator=g) * 4).to(torch.float8_e4m3fn)
        sa = torch.rand(96, device=dev, generator=g) + 0.5
        sb = torch.rand(E, N, device=dev, generator=g) + 0.5
        out = torch._scaled_grouped_mm(a, b.transpose(-2, -1), sa, sb, offs=offs, out_dtype=torch.bfloat16)
        acc = ref_grouped(a.float(), b.float().transpose(-2, -1), offs)
        rows_e = torch.repeat_interleave(torch.arange(E, device=dev),
                                         torch.diff(torch.cat([offs.new_zeros(1), offs])).long())
        ref = acc * sa[:, None] * sb[rows_e]
        return dict(dtype=str(out.dtype), equals_scaled_fp32_rounded_once=torch.equal(out, ref.bfloat16()),
                    max_rel=float(((out.float() - ref).abs() / ref.abs().clamp_min(1e-3)).max()))

    @probe(f"scaled_grouped_mm_fp8_fast_accum_{label}")
    def _(offs=offs):
        a = torch.randn(96, K, device=dev, generator=g).to(torch.float8_e4m3fn)
        b = torch.randn(E, N, K, device=dev, generator=g).to(torch.float8_e4m3fn)
        out = torch._scaled_grouped_mm(a, b.transpose(-2, -1), torch.ones(96, device=dev),
                                       torch.ones(E, N, device=dev), offs=offs, out_dtype=torch.bfloat16,
                                       use_fast_accum=True)
        return dict(dtype=str(out.dtype))


@probe("grouped_mm_bias")
def _():
    a = torch.randn(96, K, device=dev).bfloat16()
    b = torch.randn(E, K, N, device=dev).bfloat16()
    out = torch._grouped_mm(a, b, offs=offs_aligned, bias=torch.randn(E, N, device=dev).bfloat16())
    return dict(dtype=str(out.dtype))


@probe("grouped_mm_out_fp32")
def _():
    a = torch.randn(96, K, device=dev).bfloat16()
    b = torch.randn(E, K, N, device=dev).bfloat16()
    out = torch._grouped_mm(a, b, offs=offs_aligned, out_dtype=torch.float32)
    return dict(dtype=str(out.dtype), exact=torch.equal(out, ref_grouped(a, b, offs_aligned)))


@probe("torchao_import")
def _():
    import torchao
    from torchao.prototype.mx_formats import kernels  # noqa: F401
    return dict(version=torchao.__version__, kernels=[n for n in dir(kernels) if not n.startswith("_")][:60])


@probe("torchao_to_mx_cuda")
def _():
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import to_mx
    x = torch.randn(64, 256, device=dev)
    s, d = to_mx(x, torch.float8_e4m3fn, 32, ScaleCalculationMode.FLOOR)
    return dict(scale_dtype=str(s.dtype), data_dtype=str(d.dtype), device=str(d.device))


@probe("torchao_triton_mx_dim1")
def _():
    from torchao.prototype.mx_formats.kernels import triton_to_mxfp8_dim1
    x = torch.randn(128, 256, device=dev).bfloat16()
    d, s = triton_to_mxfp8_dim1(x, 32)
    return dict(data=str(d.dtype), data_shape=list(d.shape), scale=str(s.dtype), scale_shape=list(s.shape))


@probe("torchao_triton_nvfp4")
def _():
    from torchao.prototype.mx_formats.kernels import triton_quantize_nvfp4
    x = torch.randn(128, 256, device=dev).bfloat16()
    out = triton_quantize_nvfp4(x, torch.tensor(1.0, device=dev))
    return dict(types=[str(getattr(o, "dtype", type(o))) for o in (out if isinstance(out, tuple) else (out,))])


write_results_json("probe_grouped_mm.json", dict(rows=ROWS))
sys.exit(0)
