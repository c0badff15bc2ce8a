"""Where a fused-MoE backend that quantizes GEMM2's input in its own launch departs from the reference at a real
model share, stage by stage: its GEMM1 + activation output y, its re-quantized GEMM2 input a2 (dequantized values)
and its GEMM2 output z, each against the reference trace of the same case (harness.core.real_shapes); then, at
the worst output elements, how much of the output's difference the a2 deviation explains, split by the
activation's scale groups (same sign in most groups = a correlated deviation, which the bound's per-group
independence does not model).

For backends with triton_emulation's host structure (`_quantize_activation(y, ...)` returning the GEMM2 operand
values and their group scales, `_gemm(prepared, "w2", a2, mode, scale, z, ...)` writing z): triton_emulation and
the backends built on it.

    python tools/a2_deviation.py --share qwen3-30b-a3b --scheme w_fp8_a_fp8_block --tokens 64
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.backends import backend_bound_declarations, backend_structure, load_backend  # noqa: E402
from harness.backends.triton_emulation import scheme_kinds  # noqa: E402
from harness.core.conformance import Shape, backend_shape, case_problem  # noqa: E402
from harness.core.real_shapes import DISTINCT_EXPERTS, share_by_name, share_reference  # noqa: E402
from harness.core.tolerances import moe_error_bound  # noqa: E402
from harness.platforms import default_device, detect_platform  # noqa: E402
from reference.activations import ACTIVATIONS  # noqa: E402
from reference.checkpoints import make_checkpoint  # noqa: E402
from reference.moe import activation_qdq, evaluate_activation, round_to, static_activation_scales  # noqa: E402
from reference.schemes import SCHEMES  # noqa: E402
from reference.structure import RouterWeight  # noqa: E402


def _captured_forward(backend, prepared, inputs, device):
    """Run the backend, keeping y (GEMM2's input before quantization), the GEMM2 operand values and scales, z."""
    seen = {}
    quantize, gemm = backend._quantize_activation, backend._gemm

    def quantize_spy(x2, *args, **kwargs):
        values, mode, scale = quantize(x2, *args, **kwargs)
        seen.setdefault("calls", []).append((x2.clone(), values.clone(), mode, scale.clone()))
        return values, mode, scale

    def gemm_spy(prepared_, which, *args, **kwargs):
        result = gemm(prepared_, which, *args, **kwargs)
        if which == "w2":
            seen["z"] = args[3].clone()
        return result

    backend._quantize_activation, backend._gemm = quantize_spy, gemm_spy
    # each stage in its own launch: an epilogue that quantizes GEMM2's input or does the top-k sum itself would hide
    # y, or leave z unwritten (TritonEmulationBackend.fold_epilogues; bit for bit the same output either way)
    backend.fold_epilogues = False
    try:
        out = backend.forward(prepared, *(t.to(device) for t in inputs))
    finally:
        del backend._quantize_activation, backend._gemm, backend.fold_epilogues
    (_, a1_values, a1_mode, a1_scale), (y, a2_values, a2_mode, a2_scale) = seen["calls"]
    return out, (a1_values, a1_mode, a1_scale), y, a2_values, a2_mode, a2_scale, seen["z"]


def _as_numbers(values, mode, scale):
    """A quantized activation as numbers: operand values times their scales (mode 2: one per 1 x group)."""
    if mode == 2:
        return values * scale.repeat_interleave(values.shape[1] // scale.shape[1], dim=1)
    return values * scale.reshape(()) if mode == 1 else values


def _bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x == 0, torch.full_like(x, 2.0**-133), (x.abs().log2().floor() - 7).exp2())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="triton_emulation")
    p.add_argument("--share", default="qwen3-30b-a3b", help="model or model/tpN")
    p.add_argument("--scheme", default="w_fp8_a_fp8_block", choices=list(SCHEMES))
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--worst", type=int, default=5, help="output elements to break down")
    p.add_argument("--experts", type=int, help="instead of the share's")
    p.add_argument("--hidden", type=int, help="instead of the share's")
    p.add_argument("--intermediate", type=int, help="instead of the share's (per rank)")
    p.add_argument("--top-k", type=int, help="instead of the model's")
    p.add_argument("--distinct", type=int, default=DISTINCT_EXPERTS,
                   help="experts quantized from random weights, the rest derived (make_checkpoint)")
    p.add_argument("--tiles", type=json.loads, help='JSON merged over the backend\'s tiles, e.g. {"num_stages": 1}')
    args = p.parse_args(argv)

    host, device = detect_platform(), default_device()
    backend = load_backend(args.backend)
    layer, tp = share_by_name(args.share)
    act = ACTIVATIONS[layer.activation]
    e, h, i, t, k = layer.shape(tp, args.tokens)
    shape = Shape(args.experts or e, args.hidden or h, args.intermediate or i, t, args.top_k or k)
    problem, ok, reason = case_problem(backend, SCHEMES[args.scheme], act, host, shape)
    if not ok:
        print(f"{args.backend} does not run this case: {reason}")
        return 2
    ckpt = make_checkpoint(args.scheme, act, shape.num_experts, shape.hidden_size, shape.intermediate_size,
                           seed=args.seed, with_bias=True, distinct_experts=args.distinct).to(device)
    if not problem.has_bias:
        ckpt = dataclasses.replace(ckpt, b13=None, b2=None)
    inputs, out, trace = share_reference(backend, backend_shape(backend, shape), ckpt, device, args.seed)
    if args.tiles:
        backend.tiles = dict(backend.tile_config(shape.tokens * shape.top_k, *scheme_kinds(SCHEMES[args.scheme])),
                             **args.tiles)
        print(f"tiles {backend.tiles}")
    prepared = backend.prepare(ckpt)
    with torch.device(out.device):
        bound = moe_error_bound(trace, ckpt, **backend_bound_declarations(backend, args.scheme)).bound
    if not hasattr(backend, "_quantize_activation"):  # no stages to look into: the output only
        got = backend.forward(prepared, *(t.to(device) for t in inputs)).to(bound.device).double()
        ratio = (got - trace.out).abs() / bound
        print(f"{args.backend} at {args.share} {shape} distinct {args.distinct} {args.scheme}: out / bound max "
              f"{float(ratio.max()):.3f}, elements past it {int((ratio > 1).sum())}")
        return 0
    got, a1_parts, y, a2v, a2_mode, a2_scale, z = _captured_forward(backend, prepared, inputs, device)
    dev = trace.y.device
    a1 = _as_numbers(*(t.to(dev).double() if torch.is_tensor(t) else t for t in a1_parts))
    y, a2v, a2_scale, z, got = (t.to(dev).double() for t in (y, a2v, a2_scale, z, got))
    isz = y.shape[1]
    a2 = _as_numbers(a2v, a2_mode, a2_scale)
    group = isz // a2_scale.shape[1] if a2_mode == 2 else None
    print(f"{args.backend} at {args.share} {shape} distinct {args.distinct} {args.scheme} ({layer.activation}, structure "
          f"{backend_structure(backend).name}): {trace.y.shape[0]} pairs, I {isz}, H {z.shape[1]}, a2 group {group}")

    def stage(name, kern, ref):
        diff = (kern - ref).abs()
        ulps = diff / _bf16_ulp(ref)
        print(f"  {name}: {int((diff > 0).sum())} of {diff.numel()} elements differ "
              f"({float((diff > 0).double().mean()):.2%}); max {float(ulps.max()):.3g} bf16 ulp, "
              f"mean |diff| {float(diff.mean()):.3g}")
        return diff

    stage("a1 (GEMM1 input)", a1, trace.a1)
    # GEMM1 and the activation in float64 on the kernel's own a1, with the structure's rounding points
    h_k = torch.zeros_like(trace.h_pre)
    for i, e in enumerate(trace.experts.tolist()):
        rows = (trace.pair_expert == e).nonzero().flatten()
        h_k[rows] = a1[trace.pair_token[rows]] @ trace.w13[i].T + (0 if ckpt.b13 is None else ckpt.b13[e].double())
    st = backend_structure(backend)
    if st.router_weight is RouterWeight.GEMM1_EPILOGUE:
        h_k = h_k * trace.pair_weight[:, None]
    _, _, y_k = evaluate_activation(round_to(h_k, st.gemm1_out), act, st, False)
    stage("y  vs the reference's GEMM1 on the kernel's a1", y, y_k)
    stage("y  (GEMM1 + activation, bf16)", y, trace.y)
    da2 = stage("a2 (re-quantized GEMM2 input)", a2, trace.a2)
    # is the quantizer exact on the kernel's own y? then every a2 difference comes from y
    a2_from_y = activation_qdq(y.float(), ckpt.scheme.act, ckpt, static_activation_scales(ckpt)[1],
                               backend_structure(backend).fp8_static_scale).double()
    stage("a2 vs the reference quantizer on the kernel's y", a2, a2_from_y)
    if group:
        changed = (da2 > 0).reshape(da2.shape[0], -1, group)
        print(f"  groups with any a2 change: {int(changed.any(-1).sum())} of {changed.shape[0] * changed.shape[1]}; "
              f"changed codes per such group: mean {float(changed.sum(-1)[changed.any(-1)].double().mean()):.2f}, "
              f"max {int(changed.sum(-1).max())}")
    stage("z  (GEMM2 output)", z, trace.z)
    dout = stage("out", got, trace.out)
    ratio = dout / bound
    print(f"  out / bound: max {float(ratio.max()):.3f}, elements past it {int((ratio > 1).sum())}")

    hsz = z.shape[1]
    k = trace.top_k
    for flat in ratio.flatten().topk(min(args.worst, ratio.numel())).indices.tolist():
        t, c = divmod(flat, hsz)
        print(f"\n  out[{t}, {c}]: reference {float(trace.out[t, c]):.6g}, kernel {float(got[t, c]):.6g}, "
              f"bound {float(bound[t, c]):.4g} ({float(ratio[t, c]):.2f}x)")
        for j in range(k):
            pair = t * k + j
            e = int(trace.pair_expert[pair])
            i = int((trace.experts == e).nonzero())
            w2row = trace.w2[i, c]
            dz = float(z[pair, c] - trace.z[pair, c])
            d_a2 = (a2[pair] - trace.a2[pair])
            explained = float(w2row @ d_a2)
            line = (f"    k={j} expert {e} weight {float(trace.pair_weight[pair]):.3f}: z diff {dz:+.4g}, "
                    f"a2-explained {explained:+.4g}")
            if group:
                per_group = (w2row * d_a2).reshape(-1, group).sum(-1)
                nz = per_group[per_group != 0]
                line += (f"; {nz.numel()} of {per_group.numel()} groups contribute, {int((nz > 0).sum())} +, "
                         f"{int((nz < 0).sum())} -, largest {float(nz.abs().max()) if nz.numel() else 0:.3g}")
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
