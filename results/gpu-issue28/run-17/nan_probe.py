"""Issue 28 run-17, third call: make bench's Kimi-K2 NVFP4 prefill (8192 tokens, triton_bitplace, the new row: 128-row
blocks, 64-row tails, tma 1) gave non-finite outputs, gpt-oss-120b's and MXFP4's (tma 0) did not. Each switch alone
at the full model (device_checkpoint, as make bench), bit for bit against the old row (64 rows, tma 0).
    python3 results/gpu-issue28/run-17/nan_probe.py
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import torch  # noqa: E402

from harness.backends import load_backend  # noqa: E402
from harness.bench import MODEL_SHAPES, device_checkpoint, routed_inputs  # noqa: E402

BASE = dict(block_m=64, block_n=64, block_k=128, num_warps=4, num_stages=3, group_m=8)
CASES = (("kimi-k2", "w_nvfp4", 8192), ("kimi-k2", "w_nvfp4", 2048), ("gpt-oss-120b", "w_nvfp4", 8192))
VARIANTS = (dict(tma=1), dict(block_m=128), dict(block_m=128, tma=1), dict(block_m=128, tail_m=64),
            dict(block_m=128, tail_m=64, tma=1))
if sys.argv[1:] == ["more"]:  # the fourth call: MXFP4 at 128 rows by TMA, and bf16's TMA row at Kimi-K2's full shape
    CASES = (("kimi-k2", "w_mxfp4", 2048), ("kimi-k2", "bf16", 2048))
    VARIANTS = (dict(block_m=128, tma=1),)
for model, scheme, tokens in CASES:
    shape = MODEL_SHAPES[model]
    ckpt = device_checkpoint(shape, scheme, "cuda")
    be = load_backend("triton_emulation" if scheme == "bf16" else "triton_bitplace")
    if scheme == "bf16":  # its prefill row's tiles, 128 rows by pointer loads the reference
        BASE = dict(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=3, group_m=8)
    prep = be.prepare(ckpt)
    x, w, ids = routed_inputs(shape, tokens, "cuda")
    w = w.float().contiguous()
    want = be.configure(**BASE).forward(prep, x, w, ids)
    print(model, scheme, tokens, f"{BASE['block_m']} rows tma 0: finite", bool(torch.isfinite(want).all()), flush=True)
    for v in VARIANTS:
        got = be.configure(**{**BASE, **v}).forward(prep, x, w, ids)
        bad = got.view(torch.int16) != want.view(torch.int16)
        rows = bad.any(1).nonzero().flatten()
        print(f"  {v}: finite {bool(torch.isfinite(got).all())}, {int(bad.sum())} outputs differ in {len(rows)} tokens "
              f"{rows[:6].tolist()}", flush=True)
    del ckpt, prep
    torch.cuda.empty_cache()
