"""Issue 28 run-16, second call: where GEMM2 by TMA differs from tma 0 in bf16 (tma_bits.py: 49608 outputs of gpt-oss-120b
at 2048 tokens, up to 27749 ulps, deterministic; GEMM1 by TMA bit for bit): which N tiles, which row blocks (their
expert, whether the expert's last), which rows within a block, and whether block_n 64 / other tiles change it.
    python3 results/gpu-issue28/run-16/tma_where.py
"""
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import torch  # noqa: E402

from tma_bits import CPU, DEV, bf16_cases  # noqa: E402 (this directory)

BASE = dict(block_m=32 if CPU else 128, block_n=128, block_k=64, num_warps=8, num_stages=3, group_m=8)
for model, be, prep, x, w, ids in bf16_cases():
    gemm = be._gemm
    rec = {}

    def run(tiles, tma_w2):
        def spy(prep_, which, a, *args, tiles, **kw):
            t = dict(tiles, tma=tma_w2 if which == "w2" else 0)
            r = gemm(prep_, which, a, *args, tiles=t, **kw)
            rec[which] = (args[2].clone(), args[3].clone(), args[4].clone())  # out, sorted rows, block experts
            return r
        be._gemm = spy
        be.configure(**tiles)
        be.forward(prep, x, w, ids)
        be._gemm = gemm
        return rec["w2"]

    for variant in ({}, dict(block_n=64), dict(group_m=0), dict(num_stages=2), dict(block_m=16 if CPU else 64)):
        tiles = {**BASE, **variant}
        z0, rows, experts = run(tiles, 0)
        z1, _, _ = run(tiles, 1)
        bad = (z0.view(torch.int16) != z1.view(torch.int16))
        bm, bn = tiles["block_m"], tiles["block_n"]
        pos = torch.full((z0.shape[0],), -1, dtype=torch.long, device=DEV)  # a pair's slot in sorted rows
        valid = rows < z0.shape[0]
        pos[rows[valid].long()] = torch.arange(rows.numel(), device=DEV)[valid]
        pairs, cols = bad.nonzero(as_tuple=True)
        blocks = pos[pairs] // bm
        last = torch.zeros(experts.numel(), dtype=torch.bool, device=DEV)
        used = experts >= 0
        nxt = torch.cat([experts[1:], experts.new_full((1,), -1)])
        last = used & (nxt != experts)
        print(f"{model} {variant or 'base'}: {bad.sum().item()} differ; N tiles {sorted(Counter((cols // bn).tolist()).items())[:12]}; "
              f"row blocks {len(set(blocks.tolist()))} of {int(used.sum())} (an expert's last: "
              f"{int(last[blocks].sum())} of {len(blocks)} outputs); rows in block "
              f"{sorted(Counter((pos[pairs] % bm).tolist()).items())[:8]}...; experts "
              f"{sorted(Counter(experts[blocks].tolist()).items())}", flush=True)
