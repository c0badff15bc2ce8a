"""Command line: `python -m harness <command>`."""

from __future__ import annotations

import argparse
import sys


def _formats(_args) -> int:
    from reference.formats import FORMATS

    for fmt in FORMATS.values():
        sub = f"{fmt.min_subnormal:.6g}" if fmt.subnormals else "-"
        print(
            f"{fmt.name:<9} {'S' if fmt.signed else 'U'}E{fmt.ebits}M{fmt.mbits:<2} bias={fmt.bias:<3} "
            f"max={fmt.max_normal:<12.6g} min_normal={fmt.min_normal:<12.6g} min_subnormal={sub:<12} "
            f"{fmt.specials.value}"
        )
    return 0


def _bench_reference(args) -> int:
    """Throughput of the reference quantizers on CPU (median of several runs, after one warm-up)."""
    import statistics
    import time

    import torch

    from reference import E2M1, E4M3FN, Granularity, qdq_mx, quantize_fp8, quantize_mx, quantize_nvfp4

    torch.manual_seed(0)
    x = torch.randn(args.rows, args.cols)
    cases = {
        "quantize_mx e2m1 FLOOR": lambda: quantize_mx(x, E2M1),
        "qdq_mx e2m1 FLOOR": lambda: qdq_mx(x, E2M1),
        "quantize_mx e4m3fn FLOOR": lambda: quantize_mx(x, E4M3FN),
        "quantize_nvfp4": lambda: quantize_nvfp4(x),
        "quantize_fp8 e4m3fn per-token": lambda: quantize_fp8(x, E4M3FN, granularity=Granularity.PER_TOKEN),
    }
    print(f"{args.rows}x{args.cols} fp32, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"median of {args.repeat}")
    for name, fn in cases.items():
        fn()
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        med = statistics.median(times)
        print(f"  {name:<32} {med * 1e3:8.1f} ms  {x.numel() / med / 1e6:7.1f} M elements/s")
    return 0


def _schemes(_args) -> int:
    from reference.schemes import SCHEMES

    for s in SCHEMES.values():
        print(f"{s.name:<28} weight={s.weight_label:<22} act={s.act_label:<40} {s.description}")
    return 0


def _platforms(args) -> int:
    from harness.platforms import PLATFORMS, host_info

    host = host_info()
    if args.host:  # for scripts: `pytest -m "$(python -m harness platforms --host)"`
        print(host.platform.name)
        return 0
    for p in PLATFORMS.values():
        here = "  <- this machine" if p is host.platform else ""
        native = ",".join(sorted(p.native_formats)) or "-"
        print(f"{p.name:<7} fp8={p.fp8_format.name:<9} native={native:<24} priority={' > '.join(p.backend_priority)}{here}")
        print(f"        {p.description}")
    print(f"\nthis machine: {host.platform.name} ({host.device_name}), torch {host.torch_version}, triton {host.triton_version}")
    return 0


def _oracle(args) -> int:
    from harness.backends import registered_backends
    from harness.core.oracle import ORACLE_TABLE_PATH, all_platforms, format_oracle_table
    from harness.platforms import platform_by_name

    platforms = all_platforms() if args.all else [platform_by_name(args.platform)]
    table = format_oracle_table(platforms, registered_backends(args.backend), args.scheme, args.activation)
    if args.write and (args.scheme or args.activation):
        print("--write rewrites the whole table: drop --scheme/--activation", file=sys.stderr)
        return 2
    if args.write:
        ORACLE_TABLE_PATH.write_text(table)
        print(f"wrote {ORACLE_TABLE_PATH}")
    else:
        print(table, end="")
    return 0


def _catalog(args) -> int:
    """Hunt every catalog mutant with the conformance checks (harness.detection.catalog.hunt) and say which check
    caught it and how long it took; the control must survive every check."""
    import os

    os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    from harness.detection.catalog import CATALOG_PLATFORMS, CONTROL, MUTANTS, hunt, make_mutant
    from reference.structure import STRUCTURES

    torch.set_num_threads(1)
    missed, failed_controls = [], []
    print(f"platforms: {', '.join(CATALOG_PLATFORMS)}; checks: quantizer entry points, then conformance cases")
    for structure in STRUCTURES:
        print(f"\n== every mutant declaring and computing the structure {structure}")
        for m in MUTANTS:
            catch, seconds, n = hunt(make_mutant(m.name, structure))
            if catch is None:
                missed.append(f"{m.name}@{structure}")
            verdict = f"CAUGHT by {catch.check} after {n} checks" if catch else f"SURVIVED {n} checks"
            print(f"{m.name:<32} {seconds:6.2f}s  {verdict}\n    bug: {m.bug}")
            if catch:
                print(f"    {catch.message.splitlines()[0][:160]}")
        catch, seconds, n = hunt(make_mutant(CONTROL.name, structure))
        if catch:
            failed_controls.append(structure)
        print(f"control (no bug): {'FAILED ' + catch.check + ': ' + catch.message if catch else 'passed'} "
              f"({n} checks, {seconds:.1f}s)")
    total = len(MUTANTS) * len(STRUCTURES)
    print(f"\n{total - len(missed)} of {total} (mutant, structure) pairs caught; "
          f"controls failed under: {failed_controls or 'none'}")
    return 1 if missed or failed_controls else 0


def _backends(args) -> int:
    """Every registered backend (built-in, entry point, --backend), what it declares, and per platform
    whether it can run here and how many scheme x activation problems it supports."""
    from harness.backends import (backend_accumulation_error, backend_accumulation_truncation, backend_available,
                                  backend_k_order, backend_operand_dtype,
                                  backend_structure, checked_supports, registered_backends)
    from harness.backends import Problem
    from harness.platforms import PLATFORMS
    from reference.activations import ACTIVATIONS
    from reference.schemes import SCHEMES

    problems = [Problem(s, a) for s in SCHEMES.values() for a in ACTIVATIONS.values()]
    for name, backend in sorted(registered_backends(args.backend).items()):
        model = "  (capability model: does not run)" if getattr(backend, "capability_model", False) else ""
        print(f"{name}{model}")
        print(f"    structure {backend_structure(backend).label}")
        print(f"    operands {str(backend_operand_dtype(backend)).removeprefix('torch.')}, accumulation error "
              f"{backend_accumulation_error(backend):g}, truncation per K step "
              f"{backend_accumulation_truncation(backend):g}, K order {backend_k_order(backend)}")
        for p in PLATFORMS.values():
            try:
                n = sum(checked_supports(backend, prob, p)[0] for prob in problems)
                ok, why = backend_available(backend, p)
            except Exception as exc:  # noqa: BLE001 - a broken backend is reported, the listing goes on
                print(f"    {p.name:<7} broken: {type(exc).__name__}: {exc}")
                continue
            runs = "runs here" if ok else f"not here: {why}"
            print(f"    {p.name:<7} supports {n:>3} of {len(problems)} scheme x activation; {runs}")
    return 0


def _parallel(args) -> int:
    """Sharded conformance: simulated rank by rank here, or one process per rank (NCCL on GPUs, gloo on CPUs)."""
    from harness.backends import load_backend
    from harness.parallel import Parallelism
    from harness.parallel.distributed import DistributedCase, run_distributed
    from harness.parallel.sharding import PARALLEL_CASES, parallel_shape, run_parallel_case
    from harness.platforms import detect_platform
    from reference.activations import ACTIVATIONS
    from reference.schemes import SCHEMES

    cases = [(s, a) for s, a in PARALLEL_CASES if (not args.scheme or s in args.scheme)]
    cases += [(s, a) for s in (args.scheme or []) for a in (args.activation or []) if (s, a) not in cases]
    backends = args.backend or ["triton_emulation"]
    tp = args.tp or (2 if args.ep == 1 else 1)
    try:
        par = Parallelism(tp=tp, ep=args.ep)
    except ValueError as exc:
        print(f"python -m harness parallel: {exc}", file=sys.stderr)
        return 2
    failed = 0
    if args.world == "simulated":
        host = detect_platform()
        verdicts = []
        for name in backends:
            backend = load_backend(name)
            for s, a in cases:
                r = run_parallel_case(backend, SCHEMES[s], ACTIVATIONS[a], host, par, parallel_shape(SCHEMES[s], host.is_gpu))
                case = f"{s}/{a}/{name}/{par.label}"
                verdicts.append(dict(case=case, outcome="skipped", reason=r) if isinstance(r, str) else dict(
                    case=case, outcome="passed" if r.ok else "failed", reason="" if r.ok else r.message(),
                    worst_ulps=r.worst_ulps, max_ratio=r.max_ratio))
    else:
        verdicts = run_distributed([DistributedCase(name, s, a, tp=tp, ep=args.ep) for name in backends
                                    for s, a in cases], args.world)
    for v in verdicts:
        failed += v["outcome"] == "failed"
        numbers = f" worst {v['worst_ulps']:.3g} ulp, {v['max_ratio']:.2f} of the bound" if "worst_ulps" in v else ""
        print(f"{v['outcome']:<8} {v['case']} ({args.world}){numbers}{': ' + v['reason'].splitlines()[0] if v['reason'] else ''}")
    print(f"{sum(v['outcome'] == 'passed' for v in verdicts)} passed, {failed} failed, "
          f"{sum(v['outcome'] == 'skipped' for v in verdicts)} skipped")
    return 1 if failed else 0


def _diagnose(args) -> int:
    """Which numerical structures each backend's outputs conform to, over every conformance case it runs on this
    machine (or the --scheme / --activation ones): the declared one, every built-in one and every one-field change
    of the declared one (harness.core.structure_fit)."""
    from harness.backends import Declined, backend_bound_declarations, backend_prepare, backend_structure, load_backend
    from harness.core.conformance import backend_shape, case_problem, conformance_cases, default_shape, reference_run
    from harness.core.structure_fit import structure_verdicts
    from harness.platforms import PLATFORMS, detect_platform

    host = PLATFORMS[args.platform] if args.platform else detect_platform()
    for name in args.backend:
        backend = load_backend(name)
        declared = backend_structure(backend)
        fit_all: dict[str, int] = {}
        n = 0
        for case, reason in conformance_cases({backend.name: backend}, [host], host=host):
            if reason or (args.scheme and case.scheme.name not in args.scheme) or (
                    args.activation and case.activation.name not in args.activation):
                continue
            problem, _, _ = case_problem(backend, case.scheme, case.activation, host, default_shape(host))
            shape = backend_shape(backend, default_shape(host))
            ckpt, inputs, _, _ = reference_run(case.scheme.name, case.activation.name, host.fp8_format.name, shape, 0,
                                               declared, problem.has_bias)
            try:
                prepared = backend_prepare(backend, ckpt)
            except Declined:
                continue
            device = getattr(backend, "device", "cpu")
            got = backend.forward(prepared, *(t.to(device) for t in inputs)).cpu()
            verdicts = structure_verdicts(got, ckpt, inputs, declared,
                                          backend_bound_declarations(backend, ckpt.scheme.name))
            n += 1
            for label, ok in verdicts.items():
                fit_all[label] = fit_all.get(label, 0) + ok
            if args.verbose:
                print(f"  {case.id}: fits {[k for k, ok in verdicts.items() if ok] or 'nothing'}")
        every = [label for label, k in fit_all.items() if k == n]
        print(f"{backend.name} (declares {declared.name}), {n} cases on {host.name}:")
        if not n:
            print("  no case runs here")
        elif every:
            print("  conforms on every case to: " + "; ".join(every))
        else:
            best = max(fit_all.items(), key=lambda kv: kv[1])
            print(f"  conforms to no single structure on every case (best: {best[0]}, {best[1]} of {n} cases): "
                  "a deviation in some case, not only a declaration")
    return 0


def _model_shapes(args) -> int:
    """Conformance at the layer shapes real models have (harness.inputs.model_shapes), all experts' weights
    built: per (model/TP share, tokens, scheme) the verdict and the largest fraction of the bound used. On a GPU
    the reference runs there in float64 (harness.core.real_shapes)."""
    from harness.backends import load_backend
    from harness.core.real_shapes import run_model_share
    from harness.inputs.model_shapes import MODEL_LAYERS
    from harness.platforms import default_device, detect_platform
    from reference.schemes import SCHEMES

    host, device = detect_platform(), default_device()
    backends = {}
    for spec in args.backend:
        backend = load_backend(spec)
        backends[backend.name] = backend
    tally = dict(passed=0, failed=0, skipped=0)
    for layer in (MODEL_LAYERS[m] for m in (args.model or MODEL_LAYERS)):
        for tp in (t for t in layer.tp if args.tp is None or t in args.tp):
            for scheme in args.scheme or list(SCHEMES):
                for run in run_model_share(backends, layer.name(tp), scheme, host, device, tokens=tuple(args.tokens),
                                           activation=args.activation, gpu_only=False,
                                           progress=lambda r: print(r.line(), flush=True)):
                    if run.out_of_memory:  # one process, no other case beside it: the GPU is too small for it
                        tally["failed"] += 1
                        print(run.line())
                    elif run.result is None:
                        tally["skipped"] += 1
                        if args.scheme:
                            print(run.line())
                    elif not run.result.ok:
                        tally["failed"] += 1
                        print("    " + run.result.message().splitlines()[0])
                    else:
                        tally["passed"] += 1
    print(f"{tally['passed']} passed, {tally['failed']} failed, {tally['skipped']} (case, scheme, backend) not "
          f"supported or declined; models: {', '.join(args.model or MODEL_LAYERS)}")
    return 1 if tally["failed"] else 0


def _write_checkpoint(args) -> int:
    """A small MoE model directory written by a quantization tool itself (harness.peers.checkpoint_writers), for
    `pytest ... --checkpoint DIR --layer N`: the tool's own quantizer on random weights, saved as it exports."""
    from harness.inputs.checkpoints_on_disk import load_moe_layer
    from harness.peers.checkpoint_writers import WRITERS

    writer, fixed, extra = WRITERS[args.tool]
    sizes = {k: v for k, v in (("layers", args.layers), ("experts", args.experts), ("hidden", args.hidden),
                               ("inter", args.intermediate), ("seed", args.seed)) if v is not None}
    try:
        path = writer(args.out, **fixed, **sizes)
    except ImportError as exc:
        print(f"--tool {args.tool} needs the {extra!r} extra (pip install -e '.[{extra}]'): {exc}", file=sys.stderr)
        return 2
    ckpt = load_moe_layer(path, 0)
    print(f"wrote {path}: {sizes.get('layers', 2)} MoE layers, {ckpt.scheme.name}, {ckpt.activation.name}, "
          f"{ckpt.num_experts} experts, H {ckpt.hidden_size}, I {ckpt.intermediate_size}\n"
          f"run: python -m pytest suites/test_conformance.py::test_conformance --checkpoint {path} --layer 0 "
          f"--backend torch_emulation")
    return 0


def _matrix(_args) -> int:
    from harness.outputs.matrix import nightly_matrix_json

    print(nightly_matrix_json())
    return 0


COMMANDS = {
    "formats": (_formats, "every element format: bias, max normal, min normal/subnormal, Inf/NaN policy"),
    "platforms": (_platforms, "every platform: FP8 dtype, native formats, backend priorities; which one is this machine"),
    "oracle": (_oracle, "scheme x activation -> chosen backend (or why none) on a platform"),
    "schemes": (_schemes, "every quantization scheme with its weight and activation formats"),
    "catalog": (_catalog, "run the conformance suite on every seeded-bug mutant; which test caught each"),
    "backends": (_backends, "every registered backend: its structure, what it supports per platform, whether it runs here"),
    "matrix": (_matrix, "the nightly GPU CI matrix (JSON for GitHub Actions' strategy.matrix), from the platform data"),
    "bench-reference": (_bench_reference, "CPU throughput of the reference quantizers"),
    "diagnose": (_diagnose, "which numerical structure a backend's outputs conform to on every case it runs here"),
    "model-shapes": (_model_shapes, "conformance at real models' layer shapes (TP shares, 1/8/64 tokens), all experts built"),
    "parallel": (_parallel, "sharded (TP/EP) conformance: simulated, or one process per rank over NCCL/gloo"),
    "write-checkpoint": (_write_checkpoint, "a small MoE model directory written by ModelOpt, compressed-tensors, "
                         "Quark or in gpt-oss's layout, for pytest --checkpoint"),
}


def _positive_int(multiple: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an int, got {text!r}") from None
        if value <= 0 or value % multiple:
            want = "a positive int" if multiple == 1 else f"a positive multiple of {multiple}"
            raise argparse.ArgumentTypeError(f"expected {want}, got {value}")
        return value

    return parse


def main(argv: list[str] | None = None) -> int:
    from harness.platforms import PLATFORMS
    from reference.activations import ACTIVATIONS
    from reference.schemes import SCHEMES

    parser = argparse.ArgumentParser(prog="python -m harness", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (_, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        if name in ("oracle", "backends"):
            p.add_argument("--backend", action="append", default=[], help="extra backend module:factory")
        if name == "parallel":
            p.add_argument("--world", choices=["simulated", "nccl", "gloo"], default="simulated",
                           help="simulated: every rank in turn in this process; nccl: one GPU per rank; gloo: CPU ranks")
            p.add_argument("--tp", type=_positive_int(1), default=None, help="default 2, or 1 with --ep")
            p.add_argument("--ep", type=_positive_int(1), default=1)
            p.add_argument("--backend", action="append", default=[], help="registered name or module:factory "
                           "(repeatable; default triton_emulation)")
            p.add_argument("--scheme", action="append", choices=list(SCHEMES), help="only these schemes")
            p.add_argument("--activation", action="append", choices=list(ACTIVATIONS),
                           help="with --scheme: these activations too")
        if name == "diagnose":
            p.add_argument("--backend", action="append", required=True, help="registered name or module:factory")
            p.add_argument("--scheme", action="append", choices=list(SCHEMES), help="only these schemes")
            p.add_argument("--activation", action="append", choices=list(ACTIVATIONS), help="only these activations")
            p.add_argument("--verbose", action="store_true", help="each case's fits")
            p.add_argument("--platform", choices=list(PLATFORMS), help="that platform's cases at its shape (default "
                           "this machine's; cpu's are small and run on any machine)")
        if name == "model-shapes":
            from harness.inputs.model_shapes import MODEL_LAYERS

            p.add_argument("--backend", action="append", required=True, help="registered name or module:factory")
            p.add_argument("--model", action="append", choices=list(MODEL_LAYERS), help="default: every model")
            p.add_argument("--tp", action="append", type=_positive_int(1), help="default: every TP share served")
            p.add_argument("--tokens", nargs="+", type=_positive_int(1), default=[1, 8, 64])
            p.add_argument("--scheme", action="append", choices=list(SCHEMES), help="default: every scheme supported")
            p.add_argument("--activation", choices=list(ACTIVATIONS), help="default: the model's")
        if name == "write-checkpoint":
            from harness.peers.checkpoint_writers import WRITERS

            p.add_argument("--tool", required=True, choices=list(WRITERS))
            p.add_argument("--out", required=True, help="the model directory to write")
            for flag in ("--layers", "--experts", "--hidden", "--intermediate", "--seed"):
                p.add_argument(flag, type=_positive_int(1) if flag != "--seed" else int, default=None,
                               help="default: the writer's (small CPU sizes)")
        if name == "oracle":
            p.add_argument("--platform", default="cpu", choices=list(PLATFORMS))
            p.add_argument("--all", action="store_true", help="every platform")
            p.add_argument("--write", action="store_true", help="rewrite the checked-in table")
            p.add_argument("--scheme", action="append", choices=list(SCHEMES), help="only these schemes")
            p.add_argument("--activation", action="append", choices=list(ACTIVATIONS), help="only these activations")
        if name == "platforms":
            p.add_argument("--host", action="store_true", help="print only this machine's platform name")
        if name == "bench-reference":
            p.add_argument("--rows", type=_positive_int(1), default=4096)
            p.add_argument("--cols", type=_positive_int(32), default=4096, help="a multiple of 32 (the MX block)")
            p.add_argument("--repeat", type=_positive_int(1), default=7)
    args = parser.parse_args(argv)
    return COMMANDS[args.command][0](args)


if __name__ == "__main__":
    sys.exit(main())
