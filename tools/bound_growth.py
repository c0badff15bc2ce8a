"""How the derived MoE bound grows with K, beside a correct kernel's error and a real bug's (issue 24 item 7).

For each scheme and each H = I (8 experts, 8 tokens, top-4, biased, SILU, structure vllm_triton), over the
outputs that matter (|out| >= 2^-8 max|out|): the median and 90th percentile of bound / |out|; the median of the
bound with the activation re-quantization allowance removed (what the rest of the bound is); the largest
|error| / |out| of a correct kernel (and the largest fraction of its bound it uses) (the catalog's control: fp32-operand emulation, another summation order);
the median |error| / |out| of vLLM's FP8 bias-before-dequantization bug (the catalog mutant) and the fraction
of elements the bound lets it through. A bound that grows faster than the correct kernel's error shows here.

    .venv/bin/python tools/bound_growth.py [--sizes 256 1024 2880] [--scheme w_fp8_a_fp8 ...]
    .venv/bin/python tools/bound_growth.py --model-shares      # gpt-oss-120b TP1/TP2, Kimi-K2 TP8 (FP8, biased)
    .venv/bin/python tools/bound_growth.py --real-shares [--share kimi-k2/8 ...]   # every expert, every activation,
        # every structure: the bias bug's caught fraction and the correct control's verdict (issue 24, Done-when 3)
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from harness.core import tolerances  # noqa: E402
from harness.core.conformance import Shape, case_inputs  # noqa: E402
from harness.detection.catalog import make_mutant  # noqa: E402
from reference.checkpoints import make_checkpoint  # noqa: E402
from reference.moe import fused_moe  # noqa: E402
from reference.structure import structure_by_name  # noqa: E402


def _row(scheme: str, size: int, act: str = "SILU", shape: Shape | None = None) -> str:
    st = structure_by_name("vllm_triton")
    shape = shape or Shape(8, size, size, 8, 4)
    ckpt = make_checkpoint(scheme, act, shape.num_experts, shape.hidden_size, shape.intermediate_size, seed=0,
                           with_bias=True)
    x, w, ids = case_inputs(shape, 0)
    out, trace = fused_moe(x, ckpt, w, ids, structure=st, trace=True)
    o = out.double()
    big = o.abs() >= o.abs().max() * 2.0**-8
    rel = lambda t: (t.double().abs()[big] / o.abs()[big])  # noqa: E731
    bound = tolerances.moe_error_bound(trace, ckpt).bound
    saved = tolerances.requantization_deviation
    tolerances.requantization_deviation = lambda y, d_y, *a, **k: torch.zeros_like(d_y)  # noqa: E731
    try:
        no_flips = tolerances.moe_error_bound(trace, ckpt).bound
    finally:
        tolerances.requantization_deviation = saved
    correct = make_mutant("control", st)
    err_ok = correct.forward(correct.prepare(ckpt), x, w, ids).double() - o
    cells = [scheme, str(size) if shape.hidden_size == shape.intermediate_size == size else
             f"{shape.num_experts} experts, H {shape.hidden_size}, I {shape.intermediate_size}, {shape.tokens} tokens, "
             f"top-{shape.top_k}, {act}", f"{rel(bound).median():.3g}", f"{rel(bound).quantile(0.9):.3g}",
             f"{rel(no_flips).median():.3g}", f"{rel(err_ok).max():.2g}",
             f"{(err_ok.abs() / bound.double().clamp_min(1e-300))[big & (bound.double() > 0)].max():.2g}"]
    if ckpt.scheme.act is not None and ckpt.scheme.act.static:
        bug = make_mutant("fp8_bias_before_dequantization", st)
        err_bug = bug.forward(bug.prepare(ckpt), x, w, ids).double() - o
        caught = (err_bug.abs() > bound.double())[big].double().mean()
        cells += [f"{rel(err_bug).median():.3g}", f"{caught:.1%}"]
    else:
        cells += ["-", "-"]
    return "| " + " | ".join(cells) + " |"


REAL_SHARES = ("gpt-oss-120b/1", "gpt-oss-120b/2", "kimi-k2/8", "kimi-k2/1")


def _real_share_rows(share: str, tokens: int, device: str = "cpu") -> None:
    """Per activation at a real model's TP share (every expert built: make_checkpoint's distinct_experts), biased
    w_fp8_a_fp8, under every structure defined for its top_k: the smallest fraction of elements on which the FP8
    bias bug (the catalog mutant) fails, and whether the catalog's correct control passes with the largest
    fraction of the bound it uses."""
    from reference.activations import ACTIVATIONS
    from harness.inputs.model_shapes import MODEL_LAYERS
    from reference.structure import STRUCTURES

    model, tp = share.split("/")
    layer = MODEL_LAYERS[model]
    shape = Shape(*layer.shape(int(tp), tokens))
    x, w, ids = (t.to(device) for t in case_inputs(shape, 0))
    for act in ACTIVATIONS:
        start = time.perf_counter()
        ckpt = make_checkpoint("w_fp8_a_fp8", act, shape.num_experts, shape.hidden_size, shape.intermediate_size,
                               seed=0, with_bias=True, distinct_experts=8).to(device)
        caught, control, alarm = [], [], 0.0
        for name, st in STRUCTURES.items():
            if st.max_top_k is not None and shape.top_k > st.max_top_k:
                continue
            with torch.device(device):  # the reference, the bound and both emulations on `device` (float64 on a GPU)
                out, trace = fused_moe(x, ckpt, w, ids, structure=st, trace=True)
                bound = tolerances.moe_error_bound(trace, ckpt).to("cpu")
                bug, ok = make_mutant("fp8_bias_before_dequantization", st), make_mutant("control", st)
                got_bug, got_ok = (m.forward(m.prepare(ckpt), x, w, ids).cpu() for m in (bug, ok))
            alarm = max(alarm, bound.false_alarm)
            b = tolerances.compare(out.cpu(), got_bug, bound, name)
            c = tolerances.compare(out.cpu(), got_ok, bound, name)
            caught.append((b.n_bad / max(1, b.n_total), name))
            control.append((c.max_ratio, c.ok, name))
        least, least_st = min(caught)
        worst, _, worst_st = max(control)
        print(f"| {layer.name(int(tp))} ({shape.num_experts} experts, H {shape.hidden_size}, I {shape.intermediate_size}, "
              f"{tokens} tokens, top-{shape.top_k}) | {act} | {least:.1%} ({least_st}) | "
              f"{'pass' if all(o for _, o, _ in control) else 'FAIL'} {worst:.2f} ({worst_st}) | {alarm:.1e} | "
              f"{time.perf_counter() - start:.0f}s |", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", type=int, default=[256, 1024, 2048, 3072], help="H = I (multiples of 128)")
    p.add_argument("--scheme", action="append", help="default: bf16, w_mxfp4, w_fp8_a_fp8, w_fp8_a_fp8_block")
    p.add_argument("--model-shares", action="store_true",
                   help="instead: w_fp8_a_fp8 at gpt-oss-120b's TP1/TP2 and Kimi-K2's TP8 shares (16 or 8 experts)")
    p.add_argument("--real-shares", action="store_true",
                   help="instead: every expert of gpt-oss-120b TP1/TP2 and Kimi-K2 TP8/TP1, every activation and structure")
    p.add_argument("--share", action="append", choices=REAL_SHARES, help="with --real-shares: only these")
    p.add_argument("--tokens", type=int, default=8, help="with --real-shares (default 8)")
    p.add_argument("--device", default="cpu", help="with --real-shares: where the reference and emulations run "
                                                   "(cuda: float64 on the GPU)")
    args = p.parse_args()
    if args.real_shares:
        print("| share | activation | bias bug: elements caught, least over structures | correct control: verdict, "
              "largest fraction of the bound | false alarm per case | time |")
        print("|---|---|---|---|---|---|")
        for share in args.share or REAL_SHARES:
            _real_share_rows(share, args.tokens, args.device)
        return 0
    schemes = args.scheme or ["bf16", "w_mxfp4", "w_fp8_a_fp8", "w_fp8_a_fp8_block"]
    print("| scheme | H = I | bound/|out| median | p90 | bound without re-quantization flips, median | correct "
          "kernel |err|/|out| max | its largest fraction of the bound | FP8 bias bug |err|/|out| median | bug elements "
          "out of bound |")
    print("|---|---|---|---|---|---|---|---|---|")
    if args.model_shares:
        for act, shape in (("SWIGLUOAI", Shape(8, 2880, 1440, 8, 4)), ("SILU", Shape(8, 2880, 1440, 8, 4)),
                           ("GELU", Shape(8, 2880, 1440, 8, 4)), ("SWIGLUOAI", Shape(8, 2880, 2880, 8, 4)),
                           ("SILU", Shape(16, 7168, 256, 4, 8))):
            print(_row("w_fp8_a_fp8", 0, act, shape), flush=True)
        return 0
    for scheme in schemes:
        for size in args.sizes:
            print(_row(scheme, size), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
