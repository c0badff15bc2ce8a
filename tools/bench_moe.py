"""First GPU timings of the MoE backends (issue 8 will turn this into pytest-benchmark suites).

    python3 tools/bench_moe.py            # on a GPU; prints a table, writes JSON to $OUT or results/

Times one MoE forward (routing given) with triton.testing.do_bench (median, CUDA events), after checking
the output against the reference bound on a small shape. Bytes = the activated experts' weights and
scales that must be read at least once; TB/s = bytes / time.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402

from harness.backends import load_backend  # noqa: E402
from reference.checkpoints import make_checkpoint  # noqa: E402
from reference.routing import RoutingConfig, route  # noqa: E402

CASES = [  # (label, scheme, activation, E, H, I, top_k)
    # gpt-oss-120b expert shapes (H = I = 2880, top-4, MXFP4 W4A16); 32 experts built instead of 128 to keep
    # the CPU-side checkpoint build short: bytes per activated expert, what decode reads, are the same.
    ("gpt-oss-120b", "w_mxfp4", "SWIGLUOAI", 32, 2880, 2880, 4),
]
TOKENS = [1, 8, 64, 512]
BACKENDS = ["triton_emulation", "triton_dot_scaled"]


def weight_bytes(ckpt, ids) -> int:
    used = ids.unique().numel()
    total = 0
    for w in (ckpt.w13, ckpt.w2):
        per_expert = w.data[0].numel() * w.data.element_size()
        if w.scale is not None:
            per_expert += w.scale[0].numel() * w.scale.element_size()
        total += per_expert * used
    return total


def main() -> int:
    rows = []
    copy = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    copy_ms = triton.testing.do_bench(lambda: copy.clone(), warmup=25, rep=100)
    copy_tbs = 2 * copy.numel() / copy_ms / 1e9
    del copy
    print(f"device copy: {copy_tbs:.2f} TB/s (read + write)")
    for label, scheme, act, e, h, i, k in CASES:
        ckpt = make_checkpoint(scheme, act, e, h, i, seed=0, outlier_channels=0)
        for t in TOKENS:
            g = torch.Generator().manual_seed(t)
            x = torch.randn(t, h, generator=g).to(torch.bfloat16)
            w, ids = route(torch.randn(t, e, generator=g), RoutingConfig(top_k=k))
            nbytes = weight_bytes(ckpt, ids)
            for name in BACKENDS:
                b = load_backend(name)
                prep = b.prepare(ckpt)
                dev = getattr(b, "device", "cpu")
                xs, ws, idss = x.to(dev), w.to(dev), ids.to(dev)
                ms = triton.testing.do_bench(lambda: b.forward(prep, xs, ws, idss), warmup=5, rep=20)
                row = dict(case=label, scheme=scheme, tokens=t, backend=name, ms=ms, bytes=nbytes,
                           tb_s=nbytes / ms / 1e9, pct_copy=100 * nbytes / ms / 1e9 / copy_tbs, device=dev)
                rows.append(row)
                print(f"{label:<14} T={t:<5} {name:<18} {ms:9.3f} ms  {row['tb_s']:6.3f} TB/s  "
                      f"{row['pct_copy']:5.1f}% of copy  ({dev})")
    out = Path(os.environ.get("OUT", "results")) / "bench_moe.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(copy_tb_s=copy_tbs, gpu=torch.cuda.get_device_name(0), torch=torch.__version__,
                                   triton=triton.__version__, rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
