"""Warp-instructions per weight byte of the MoE GEMM's K loop, without a GPU (issue 15: the number that
says whether a decode change can help before any timing; ../shared/PERF.md, "Count instructions").

Each weight path's GEMM1 launch is captured as the backend would make it at a model shape (the real
arguments, tiles and constexprs), compiled for sm90 with the installed Triton's bundled ptxas, disassembled
with its nvdisasm, and the innermost loop that issues the tensor-core instructions is counted:

    warp-instructions per weight byte = loop instructions x warps / weight bytes read per iteration

Budget at the H200's copy rate: ~0.245 (PERF.md). The counts depend on the Triton version: the H200 runs 3.6,
this CPU venv may hold another; say which when you quote them.

    python tools/count_loop_instructions.py [--tokens 8] [--model gpt-oss-120b] [--path w_nvfp4/triton_bitplace ...]
                                            [--path w_mxfp4/triton_bitplace+gluon]  # the Gluon decode GEMM
                                            [--sass DIR]   # JSON to $OUT (or results/); --sass: each loop's SASS
                                            [--tiles block_m=128 ...]  # over the tile table's (+gluon too:
                                            # gluon_prefill=1 block_m=64 ... its prefill launch; bf16 with
                                            # gluon_bf16=1 ...: the bf16 Gluon kernel's)

At prefill sizes the weights' bytes are not the bound but the tensor cores are: each line also gives the K step's
issue time over its MMA time on one multiprocessor (harness.bench.diagnosis.issue_over_mma).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections import Counter
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"  # compile, never interpret: set before any kernel is defined
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402

from harness.backends import load_backend  # noqa: E402
from harness.backends import triton_kernels as K  # noqa: E402
from harness.backends.compile_check import compile_launch  # noqa: E402
from harness.backends import triton_emulation  # noqa: E402
from harness.backends.triton_emulation import scheme_kinds, split_k_to_fill  # noqa: E402
from harness.bench import MODEL_SHAPES, routed_inputs  # noqa: E402
from harness.bench.diagnosis import (INSTRUCTION_BUDGET as BUDGET, issue_over_mma, k_loop, sass,  # noqa: E402
                                     weight_bytes_per_iteration)
from harness.bench.report import write_results_json  # noqa: E402
from reference.checkpoints import make_checkpoint  # noqa: E402

PATHS = [("bf16", "triton_emulation"), ("w_mxfp4", "triton_emulation"), ("w_mxfp4", "triton_dot_scaled"),
         ("w_mxfp4", "triton_bitplace"), ("w_nvfp4", "triton_emulation"), ("w_nvfp4", "triton_bitplace")]


class _Captured(Exception):
    pass


def capture_gemm1(scheme: str, backend_name: str, model: str, tokens: int, over: dict | None = None
                  ) -> tuple[tuple, dict]:
    """The (args, kwargs) of the backend's first moe_gemm_kernel launch (GEMM1) at the model's H and I, from a
    small checkpoint of the same layout (8 experts). BACKEND+gluon: triton_bitplace with its warp-specialised Gluon
    decode GEMM switched on, whose bitplace_partials_kernel launch is captured instead (kwargs BLOCK_N / BLOCK_K /
    num_warps then name its consumer warpgroup's tile; its one producer warp is not counted)."""
    shape = MODEL_SHAPES[model]
    gluon = backend_name.endswith("+gluon")
    backend = load_backend(backend_name.removesuffix("+gluon"))
    if gluon:
        backend.gluon = True
    # (the tiles' gluon_bf16: triton_emulation's bf16 GEMMs by gluon_kernels.bf16_prefill_kernel)
    kernel = ("bitplace_partials_kernel" if gluon else "bf16_prefill_kernel" if (over or {}).get("gluon_bf16")
              else "moe_gemm_kernel")
    backend.device = "cpu"
    ckpt = make_checkpoint(scheme, shape.activation, 8, shape.hidden_size, shape.intermediate_size, seed=0,
                           with_bias=shape.biased)
    x, w, _ = routed_inputs(shape, tokens, "cpu")
    ids = torch.randn(tokens, 8, generator=torch.Generator().manual_seed(0)).topk(shape.top_k).indices  # 8 experts
    captured = {}

    class _Grab:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                captured.update(args=args, kwargs=kwargs)
                raise _Captured
            return launch

    real = getattr(K, kernel)
    setattr(K, kernel, _Grab())
    # the routing alignment's own Triton kernel would need a GPU driver to launch here: its torch twin gives the
    # same blocks
    backend._align = lambda topk_ids, num_experts, bm, nvfp4=None, pdl=False: backend._align_torch(topk_ids, num_experts,
                                                                                                bm)
    # and an activation quantizer's kernel likewise (W4A4 paths): the GEMM's operands have the same dtypes and
    # layout whatever the values, and only GEMM1's launch is wanted
    backend._quantize_activation = lambda x2, scale, aq, fmt: ((x2, 0, x2) if aq is None else
                                                               (x2.to(torch.bfloat16), 1, torch.ones(1)))
    if over:  # the table's tiles at the model's pair count, the given keys over them (launch flags too; +gluon:
        # gluon_prefill=1 with block_m 32-128 captures the Gluon kernel's prefill launch)
        kinds = scheme_kinds(ckpt.scheme)
        backend.configure(**{k: v for k, v in dict(backend.tile_config(tokens * shape.top_k, *kinds), **over).items()
                             if k in triton_emulation.TILE_KEYS})
    torch_align, triton_emulation.PREFILL_ALIGN_TORCH = triton_emulation.PREFILL_ALIGN_TORCH, True  # prefill's likewise
    try:
        backend.forward(backend.prepare(ckpt), x, w.float(), ids)
    except _Captured:
        pass
    finally:
        setattr(K, kernel, real)
        triton_emulation.PREFILL_ALIGN_TORCH = torch_align
    if not captured:
        raise RuntimeError(f"{backend_name} on {scheme} launched no {kernel}")
    # the tiles a GPU would pick (the capture ran with the interpreter's small ones): same pair count
    tiles = backend.tile_config(x.shape[0] * ids.shape[1], *scheme_kinds(ckpt.scheme))
    tiles = dict(tiles, **(over or {}))
    if gluon or kernel == "bf16_prefill_kernel":
        kwargs = dict(captured["kwargs"], SPLIT_K=1)
    else:
        kwargs = dict(captured["kwargs"], BLOCK_M=tiles["block_m"], BLOCK_N=tiles["block_n"],
                      BLOCK_K=tiles["block_k"], INTERPRET_DOT=False, num_warps=tiles["num_warps"],
                      num_stages=tiles["num_stages"])
        kwargs.pop("SPLIT_K", None)  # the capture's 8 experts are not the model's: split as the model's grid would
    if "split_k_programs" in tiles:
        pairs = x.shape[0] * ids.shape[1]
        split = split_k_to_fill(tiles, min(shape.num_experts, pairs) * -(-shape.intermediate_size // tiles["block_n"]))
        if split["split_k"] > 1:
            kwargs["SPLIT_K"] = split["split_k"]
    return captured["args"], kwargs


def compile_sm90(args: tuple, kwargs: dict):
    if "INLINE" in kwargs:  # the bf16 Gluon kernel's launch
        return compile_launch(K.bf16_prefill_kernel, args, {k: v for k, v in kwargs.items() if k != "SPLIT_K"})
    if "PAIRS" in kwargs:  # the Gluon kernel's launch (its layouts are constexprs)
        return compile_launch(K.bitplace_partials_kernel, args, kwargs)
    return compile_launch(K.moe_gemm_kernel, args, kwargs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt-oss-120b", choices=list(MODEL_SHAPES))
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--path", action="append", metavar="SCHEME/BACKEND", help=f"only these (default: {PATHS})")
    ap.add_argument("--sass", metavar="DIR", help="write each loop's SASS there, with its opcode histogram")
    ap.add_argument("--tiles", action="append", default=[], metavar="KEY=INT",
                    help="tile keys over the table's (any of triton_emulation.TILE_KEYS)")
    args = ap.parse_args(argv)
    over = {k: int(v) for k, v in (t.split("=", 1) for t in args.tiles)}
    unknown = set(over) - set(triton_emulation.TILE_KEYS)
    if unknown:
        ap.error(f"--tiles: unknown keys {sorted(unknown)} (backend.configure's: {triton_emulation.TILE_KEYS})")
    rows = []
    print(f"triton {triton.__version__}, sm90, {args.model}, {args.tokens} tokens; budget {BUDGET} at copy rate")
    for scheme, backend_name in [tuple(p.split("/")) for p in args.path] if args.path else PATHS:
        launch_args, kwargs = capture_gemm1(scheme, backend_name, args.model, args.tokens, over)
        compiled = compile_sm90(launch_args, kwargs)
        loop = k_loop(*sass(compiled.asm["cubin"]))
        if "INLINE" in kwargs:  # the bf16 Gluon kernel: a consumer warpgroup's two 64-row tiles (gate and up when
            # gated) of one 64-value step, BM pairs
            kwargs.update(BLOCK_M=kwargs["BM"], BLOCK_N=64 if kwargs["GATED"] else 128, BLOCK_K=kwargs["BK"],
                          num_stages=kwargs["STAGES"])
        elif "PAIRS" in kwargs:  # the Gluon kernel: a 64-row tile (gate and up when gated) of one 128-value chunk,
            # BM pairs (16 at decode)
            kwargs.update(BLOCK_M=kwargs.get("BM", 16), BLOCK_N=64, BLOCK_K=128, num_stages=kwargs["STAGES"])
        nbytes = weight_bytes_per_iteration(scheme, kwargs["BLOCK_N"], kwargs["BLOCK_K"], bool(kwargs.get("GATED")))
        per_byte = len(loop) * kwargs["num_warps"] / nbytes
        ratio = issue_over_mma(len(loop), kwargs["num_warps"], kwargs["BLOCK_M"],
                               kwargs["BLOCK_N"] * (2 if kwargs.get("GATED") else 1), kwargs["BLOCK_K"],
                               fp8=any(re.search(r"HGMMA\S*\.E[45]M", i) for i in loop))
        row = dict(scheme=scheme, backend=backend_name, loop_instructions=len(loop), num_warps=kwargs["num_warps"],
                   weight_bytes_per_iteration=nbytes, warp_instructions_per_byte=round(per_byte, 4),
                   issue_over_mma=round(ratio, 3),
                   tiles={k: kwargs[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages")},
                   triton=triton.__version__)
        rows.append(row)
        if args.sass:
            ops = Counter(ins.split()[0] if not ins.startswith("@") else ins.split()[1] for ins in loop)
            out = Path(args.sass) / f"{args.model}-T{args.tokens}-{scheme}-{backend_name}.sass"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text("\n".join(f"{n:5d} {op}" for op, n in ops.most_common()) + "\n\n" + "\n".join(loop) + "\n")
        print(f"{scheme:<10} {backend_name:<18} loop {len(loop):>5} instr x {kwargs['num_warps']} warps / {nbytes:>6} B "
              f"= {per_byte:.3f} warp-instr/byte ({per_byte / BUDGET:.1f}x the budget); BLOCK_M {kwargs['BLOCK_M']}: "
              f"issue / MMA {ratio:.2f}", flush=True)
    write_results_json("loop_instructions.json", dict(model=args.model, tokens=args.tokens, rows=rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
