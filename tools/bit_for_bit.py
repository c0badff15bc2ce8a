"""Two backends' forwards compared bit for bit at a model's sizes (8 of its experts), over a grid of launch
parameters: the smoke check of a kernel change before it is timed (results/gpu-issue28/run-*).

    python3 tools/bit_for_bit.py --model gpt-oss-120b --scheme w_nvfp4_a_nvfp4 --tokens 1 8 64 \
        --ref triton_bitplace --ref-config num_stages=3 --backend triton_bitplace_gluon --config num_stages=4 \
        --sweep split_k=1,3 --sweep pdl=0,1 [--replays 10]

Both backends take the decode tiles (block_m 16, block_n 64, block_k 128, 4 warps) plus their --config; each --sweep
key goes to both where the reference takes it (split_k: the same fp32 summation order), else to the backend alone.
--replays N also replays a CUDA graph of the backend's launch N times after L2 flushes and compares each output
(programmatic dependent launches overlap only there). One line per point; the exit status is the number of points
that differ (capped at 100). --model cpu runs the interpreter's small shape on the CPU.
Across processes (a switch read once at import, such as MOE_CONFORMANCE_HALF_SELECT): --save FILE keeps the
backend's outputs of every point, and a later run with --against FILE (no --ref) compares its backend with them:

    MOE_CONFORMANCE_HALF_SELECT=0 python3 tools/bit_for_bit.py ... --backend triton_bitplace --save /tmp/a.pt
        (with --ref too, the points are compared as well)
    python3 tools/bit_for_bit.py ... --backend triton_bitplace --against /tmp/a.pt
"""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from harness.backends import load_backend  # noqa: E402
from harness.bench import CPU_SHAPE, MODEL_SHAPES, capture, flush_l2, routed_inputs  # noqa: E402
from reference.checkpoints import make_checkpoint  # noqa: E402

DECODE_TILES = dict(block_m=16, block_n=64, block_k=128, num_warps=4)
REF_KEYS = ("split_k", "block_n", "num_stages")  # the keys a reference backend is swept along with


def _ints(pairs: list[str]) -> dict[str, list[int]]:
    return {k: [int(v) for v in vs.split(",")] for k, vs in (p.split("=", 1) for p in pairs)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help=f"one of {sorted(MODEL_SHAPES)} or cpu")
    ap.add_argument("--scheme", required=True)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--ref", help="the reference backend (or --against)")
    ap.add_argument("--save", metavar="FILE", help="keep the backend's output of every point in FILE")
    ap.add_argument("--against", metavar="FILE", help="compare with the outputs a --save run kept, not with --ref")
    ap.add_argument("--backend", required=True)
    ap.add_argument("--ref-config", action="append", default=[], metavar="KEY=INT")
    ap.add_argument("--config", action="append", default=[], metavar="KEY=INT")
    ap.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2")
    ap.add_argument("--replays", type=int, default=0)
    ap.add_argument("--experts", type=int, default=8)
    args = ap.parse_args(argv)
    if args.ref and args.against or not (args.ref or args.against or args.save):
        ap.error("give --ref (a backend to run) or --against (a file a --save run wrote), or --save alone")
    shape = CPU_SHAPE if args.model == "cpu" else MODEL_SHAPES[args.model]
    device = "cpu" if args.model == "cpu" else "cuda"
    ckpt = make_checkpoint(args.scheme, shape.activation, args.experts, shape.hidden_size, shape.intermediate_size,
                           seed=0, with_bias=shape.biased)
    if args.ref:
        ref = load_backend(args.ref)
        ref_prep = ref.prepare(ckpt)
    backend = load_backend(args.backend)
    prep = backend.prepare(ckpt)
    kept = torch.load(args.against) if args.against else None
    saved = {}
    ref_config = {k: v[0] for k, v in _ints(args.ref_config).items()}
    config = {k: v[0] for k, v in _ints(args.config).items()}
    sweep = _ints(args.sweep)
    differ = 0
    for tokens in args.tokens:
        x, w, _ = routed_inputs(shape, tokens, device)
        w = w.float().contiguous()
        # routed among the checkpoint's experts (routed_inputs draws among the model's)
        ids = torch.randn(tokens, args.experts, generator=torch.Generator().manual_seed(tokens)).topk(
            shape.top_k).indices.to(device)
        for point in (dict(zip(sweep, values)) for values in itertools.product(*sweep.values())):
            key = f"T={tokens} " + " ".join(f"{k} {v}" for k, v in point.items())
            if kept is not None:
                if key not in kept:
                    raise SystemExit(f"{args.against} has no output for {key!r} (it has {sorted(kept)})")
                want = kept[key].to(device)
            elif not args.ref:  # --save alone: the outputs kept, nothing compared
                backend.configure(**{**DECODE_TILES, **config, **point})
                saved[key] = backend.forward(prep, x, w, ids).cpu()
                print(f"{args.scheme} {args.model} {key}: kept", flush=True)
                continue
            else:
                shared = {k: v for k, v in point.items() if k in REF_KEYS}
                want = ref.configure(**{**DECODE_TILES, **ref_config, **shared}).forward(ref_prep, x, w, ids)
            backend.configure(**{**DECODE_TILES, **config, **point})
            got = backend.forward(prep, x, w, ids)
            saved[key] = got.cpu()
            same = torch.equal(got.view(torch.int16), want.view(torch.int16))
            replay, out = capture(lambda: backend.launch(prep, x, w, ids)) if args.replays else (None, None)
            for _ in range(args.replays):
                flush_l2()
                replay()
                torch.cuda.synchronize()
                same = same and torch.equal(out.view(torch.int16), want.view(torch.int16))
            differ += not same
            label = " ".join(f"{k} {v}" for k, v in point.items())
            # which kernel computed GEMM1 (a Triton backend's last launch), so that a fallback is seen
            kernel = getattr(getattr(backend, "last_compiled", {}).get("w13"), "name", None)
            label += f" (GEMM1: {kernel})" if kernel else ""
            print(f"{args.scheme} {args.model} T={tokens} {label}: bit for bit {same}; "
                  f"max |diff| {(got.float() - want.float()).abs().max().item():.3g}", flush=True)
    if args.save:
        torch.save(saved, args.save)
    return min(differ, 100)


if __name__ == "__main__":
    sys.exit(main())
