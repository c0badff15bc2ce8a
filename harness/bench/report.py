"""The benchmark report: bench/results.json, table.md, targets.md and roofline.png from one run's rows."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .targets import evaluate_targets, format_targets

__all__ = ["write_bench_report", "write_results_json", "finish_tool", "run_switches"]


def write_results_json(name: str, payload: dict) -> Path:
    """$OUT/<name> (or results/<name>): where the GPU tools leave their JSON."""
    out = Path(os.environ.get("OUT", "results")) / name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=1))
    return out


def finish_tool(name: str, copy_bandwidth: float, rows: list[dict]) -> int:
    """A GPU tool's last step: its rows and the copy bandwidth they are measured against to $OUT/<name>;
    the process exit code."""
    write_results_json(name, dict(copy_tb_s=copy_bandwidth / 1e12, rows=rows))
    return 0


def write_bench_report(rows: list[dict], anchors: dict, out_dir, cut_short: bool = False) -> dict:
    """bench/results.json, bench/table.md and bench/roofline.png from the benchmark rows. cut_short: the run was
    stopped (SIGTERM) before every selected row ran; each file says so, and a target whose rows did not run is
    absent, not missed."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    switches = run_switches()
    (out / "results.json").write_text(json.dumps(dict(anchors=anchors, rows=rows, cut_short=cut_short,
                                                      switches=switches), indent=1))
    warning = ([f"**Cut short** (SIGTERM) after {len(rows)} row{'s' * (len(rows) != 1)}: the rows and targets of the tests that did not run "
                "are missing.", ""] if cut_short else [])
    lines = warning + [f"Copy bandwidth {anchors.get('copy_tb_s', 0):.2f} TB/s, bf16 dense matmul "
             f"{anchors.get('dense_bf16_tflops', 0):.0f} TFLOP/s (measured in this run); {anchors.get('device', '')}",
             _board(anchors.get("gpu") or {}),
             "Switches: " + (", ".join(f"`{k}={v}`" for k, v in switches.items()) if switches else
                             "none (every MOE_CONFORMANCE_* default)"),
             "% dense: against the anchor above; at the token counts a target judges by it (8192), against the dense "
             "matmul read after the row, the lower of cold (both after 1 s idle) and sustained (both after 1 s back "
             "to back: the power cap), each in brackets; median us is then the sustained one.",
             "",
             "| model | scheme | tokens | backend | median us | TB/s | % copy | TFLOP/s | % dense |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["model"], r["scheme"], r["tokens"], r["backend"])):
        lines.append(f"| {r['model']} | {r['scheme']} | {r['tokens']} | {r['backend']} | {r['us']:.1f} | "
                     f"{r['tb_s']:.2f} | {r['pct_copy']:.1f} | {r['tflops']:.1f} | {_pct_dense_cell(r)} |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    paths = dict(json=out / "results.json", table=out / "table.md", targets=out / "targets.md")
    targets = evaluate_targets(rows, anchors)
    paths["targets"].write_text("\n".join(warning) + ("\n" if warning else "") + format_targets(targets))
    if rows and anchors.get("copy_tb_s"):
        paths["roofline"] = _roofline(rows, anchors, out / "roofline.png")
    return paths


# MOE_CONFORMANCE_* variables that choose no kernel: where files and databases are, the run's commit and limits
_NOT_SWITCHES = frozenset(f"MOE_CONFORMANCE_{n}" for n in ("COMMIT", "CASE_TIMEOUT", "CASE_GB", "SHARED_DB",
                                                            "HYPOTHESIS_DB", "THIRD_PARTY", "REQUIRE_BROWSER",
                                                            "GPU_CASES"))


def run_switches() -> dict[str, str]:
    """The MOE_CONFORMANCE_* variables of this process's environment that pick kernels (the backends read their A/B
    switches and tile overrides from them at import; not _NOT_SWITCHES), so that a run's figures say which kernels
    they are of."""
    return {k: os.environ[k] for k in sorted(os.environ) if k.startswith("MOE_CONFORMANCE_") and k not in _NOT_SWITCHES}


def _pct_dense_cell(row: dict) -> str:
    if "pct_dense_sustained" in row:
        return (f"{row['pct_dense']:.1f} (sustained {row['pct_dense_sustained']:.1f}, "
                f"cold {row['pct_dense_cold']:.1f})")
    return f"{row['pct_dense']:.1f}"


def _board(gpu: dict) -> str:
    """The board and its state when the run's anchors were measured (harness.bench.timing.gpu_state), one line."""
    if not gpu:
        return ""
    return (f"Board {gpu.get('uuid', '?')} at {gpu.get('pci.bus_id', '?')}, driver {gpu.get('driver_version', '?')}; "
            f"when the anchors were measured: "
            f"SM clock {gpu.get('clocks.sm', '?')} (max {gpu.get('clocks.max.sm', '?')}), memory clock "
            f"{gpu.get('clocks.mem', '?')}, power {gpu.get('power.draw', '?')} of {gpu.get('power.limit', '?')}, "
            f"{gpu.get('temperature.gpu', '?')} C, throttle reasons {gpu.get('clocks_throttle_reasons.active', '?')}")


def _series(row: dict) -> str:
    """The plot's series: the backend, with the unquantized baseline apart from the quantized runs."""
    return f"bf16 unquantized ({row['backend']})" if row["scheme"] == "bf16" else row["backend"]


def _roofline(rows: list[dict], anchors: dict, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bw, peak = anchors["copy_tb_s"] * 1e12, anchors["dense_bf16_tflops"] * 1e12
    fig, ax = plt.subplots(figsize=(9, 6), dpi=110)
    xs = [r["flops"] / r["bytes"] for r in rows]
    lo, hi = min(xs) / 2, max(xs) * 2
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(grid, [min(bw * x, peak) / 1e12 for x in grid], "k-", linewidth=1, label="roofline (measured copy BW, bf16 dense)")
    markers = dict(zip(sorted({r["model"] for r in rows}), "osD^v"))
    colours = {b: f"C{i}" for i, b in enumerate(sorted({_series(r) for r in rows}))}
    for r in rows:
        ax.scatter(r["flops"] / r["bytes"], r["tflops"], marker=markers[r["model"]], color=colours[_series(r)], s=22)
    for b, c in colours.items():
        ax.scatter([], [], color=c, label=b)
    for m, mk in markers.items():
        ax.scatter([], [], marker=mk, color="grey", label=m)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per byte of activated weights + activations)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(f"MoE forward on {anchors.get('device', 'GPU')}: every backend, shape, scheme and token count", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
