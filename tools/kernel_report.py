"""Where the time of the Triton MoE GEMM goes: compile the GEMM1 kernel of each weight path at the
gpt-oss-120b shape and report registers, spills, shared memory, occupancy, the SASS instruction mix
(static counts by class) and the K loop's warp-instructions per weight byte (harness.bench.diagnosis.loop_facts),
beside the measured time of the whole forward at 64 tokens.

    python3 tools/kernel_report.py      # on the GPU; JSON to $OUT/kernel_report.json (or results/)
"""
from __future__ import annotations

import collections
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from harness.backends import load_backend  # noqa: E402
from harness.bench.diagnosis import loop_facts, occupancy  # noqa: E402
from harness.bench.report import finish_tool  # noqa: E402
from harness.bench import MODEL_SHAPES, capture, copy_bandwidth, device_checkpoint, median_ms, routed_inputs, weight_bytes  # noqa: E402

VARIANTS = [("bf16", "triton_emulation"), ("w_mxfp4", "triton_emulation"), ("w_mxfp4", "triton_dot_scaled"),
            ("w_nvfp4", "triton_emulation"), ("w_mxfp4", "triton_bitplace"), ("w_nvfp4", "triton_bitplace")]
CLASSES = {  # SASS opcode prefix -> class
    "tensor": ("HGMMA", "HMMA", "WGMMA"), "global memory": ("LDG", "STG", "LDGSTS", "UTMALDG", "LDGDEPBAR"),
    "shared memory": ("LDS", "STS", "LDSM", "STSM"), "fp32 math": ("FMUL", "FFMA", "FADD", "FMNMX", "FSETP", "FSEL"),
    "conversion / permute": ("F2F", "F2I", "I2F", "PRMT", "F2FP"), "integer / logic": ("IADD", "IMAD", "LOP3", "SHF", "ISETP",
                                                                                    "SEL", "LEA", "IMNMX", "BMSK", "SGXT"),
}


def sass_mix(sass: str) -> dict:
    counts = collections.Counter()
    for line in sass.splitlines():
        # nvdisasm style "/*0040*/  OPCODE ..." or Triton's "ctrl\tOPCODE ...", either with a predicate
        m = re.match(r"(?:\s*/\*[0-9a-f]+\*/\s+|[-\w:]+\t)(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
        if not m:
            continue
        op = m.group(1)
        cls = next((c for c, prefixes in CLASSES.items() if op.startswith(prefixes)), "other")
        counts[cls] += 1
        counts["total"] += 1
    return dict(counts)


PTX_CLASSES = {  # PTX opcode prefix -> class (the compiler's report before ptxas)
    "tensor": ("wgmma", "mma"), "global memory": ("ld.global", "st.global", "cp.async"),
    "shared memory": ("ld.shared", "st.shared", "ldmatrix", "stmatrix"),
    "fp32 math": ("fma.rn.f32", "mul.f32", "mul.rn.f32", "add.f32", "add.rn.f32", "max.f32", "min.f32", "sub.f32",
                  "neg.f32", "ex2", "rcp", "div"),
    "conversion / permute": ("cvt", "prmt", "mov.b32 {", "mov.b64 {"),
    "integer / logic": ("and.", "or.", "xor.", "shl.", "shr.", "add.s", "add.u", "sub.s", "mul.lo", "mad.lo", "selp",
                        "setp", "min.s", "max.s", "bfe", "bfi", "lop3"),
}


def ptx_mix(ptx: str) -> dict:
    counts = collections.Counter()
    for line in ptx.splitlines():
        op = line.strip()
        if not op or op.startswith(("//", ".", "{", "}", "$")) or op.endswith(":"):
            continue
        op = op.split("@", 1)[-1].lstrip("!%p0123456789 ") if op.startswith("@") else op
        cls = next((c for c, prefixes in PTX_CLASSES.items() if op.startswith(prefixes)), "other")
        counts[cls] += 1
        counts["total"] += 1
    return dict(counts)


def main() -> int:
    shape = MODEL_SHAPES["gpt-oss-120b"]
    bw = copy_bandwidth()
    rows = []
    for scheme, name in VARIANTS:
        ckpt = device_checkpoint(shape, scheme, "cuda")
        backend = load_backend(name)
        prep = backend.prepare(ckpt)
        x, w, ids = routed_inputs(shape, 64, "cuda")
        w = w.float().contiguous()
        replay, _ = capture(lambda: backend.launch(prep, x, w, ids))
        ms = median_ms(replay, rounds=10)
        k = backend.last_compiled["w13"]
        try:
            sass = k.asm["sass"]
        except Exception as exc:  # no disassembler: fall back to PTX line counts
            sass = ""
            print(f"no SASS ({exc}); PTX only")
        regs, spills, smem = k.n_regs, k.n_spills, k.metadata.shared
        tiles = backend.last_launch["w13"][1]  # the tiles GEMM1 ran with
        occ = occupancy(regs, smem, tiles["num_warps"])
        try:  # the K loop's warp-instructions per weight byte, from this launch's own SASS (budget ~0.245)
            per_byte = loop_facts(k.asm["cubin"], scheme, tiles, ckpt.activation.gated)
        except Exception as exc:  # noqa: BLE001 - no nvdisasm, or no tensor-core loop found: say so
            per_byte = dict(loop_error=f"{type(exc).__name__}: {exc}"[:200])
        row = dict(scheme=scheme, backend=name, us=ms * 1e3, pct_copy=100 * weight_bytes(ckpt, ids) / (ms / 1e3) / bw,
                   regs=regs, spills=spills, shared_bytes=smem, blocks_per_sm=occ["programs_per_sm"],
                   warps_per_sm=occ["warps_per_sm"], occupancy_limited_by=occ["limited_by"],
                   sass=sass_mix(sass), sass_head=sass[:300], ptx=ptx_mix(k.asm["ptx"]),
                   tile=tiles, **per_byte)
        rows.append(row)
        print(json.dumps(row), flush=True)
        del prep, ckpt
        torch.cuda.empty_cache()
    return finish_tool("kernel_report.json", bw, rows)


if __name__ == "__main__":
    sys.exit(main())
