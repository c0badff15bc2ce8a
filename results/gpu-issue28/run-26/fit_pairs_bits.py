"""Issue 28 run-26 (session 27): EPILOGUE_FIT_PAIRS (now the default) against 16 pairs a program, compiled on the
H200: triton_bitplace_gluon and triton_bitplace at each model's H and I (8 experts, reference checkpoints), 1, 2, 3 and
4 tokens (4-16 pairs: programs of 4, 8 and 16), MXFP4 W4A16, NVFP4 W4A16 and NVFP4 W4A4; the two outputs compared bit
for bit. Exit status: the number of points that differ.

    python3 results/gpu-issue28/run-26/fit_pairs_bits.py [MODEL ...]    # default: both models
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch  # noqa: E402

from harness.backends import load_backend, triton_emulation  # noqa: E402
from harness.bench import MODEL_SHAPES  # noqa: E402
from reference.checkpoints import make_checkpoint  # noqa: E402
from reference.routing import RoutingConfig, route  # noqa: E402

differ = 0
for model in sys.argv[1:] or ("gpt-oss-120b", "kimi-k2"):
    shape = MODEL_SHAPES[model]
    for scheme in ("w_mxfp4", "w_nvfp4", "w_nvfp4_a_nvfp4"):
        ckpt = make_checkpoint(scheme, shape.activation, 8, shape.hidden_size, shape.intermediate_size, seed=0,
                               with_bias=shape.biased)
        for name in ("triton_bitplace_gluon", "triton_bitplace"):
            backend = load_backend(name)
            prep = backend.prepare(ckpt)
            for tokens in (1, 2, 3, 4):
                g = torch.Generator().manual_seed(tokens)
                x = torch.randn(tokens, shape.hidden_size, generator=g).to(torch.bfloat16).cuda()
                w, ids = route(torch.randn(tokens, 8, generator=g), RoutingConfig(top_k=shape.top_k))
                w, ids = w.float().cuda(), ids.cuda()
                outs = []
                for fit in (False, True):
                    triton_emulation.EPILOGUE_FIT_PAIRS = fit
                    outs.append(backend.forward(prep, x, w, ids).clone())
                same = torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16))
                differ += not same
                print(f"{model} {scheme} {name} T={tokens}: {'bit for bit' if same else 'DIFFER'} "
                      f"(|out| sum {outs[1].float().abs().sum().item():.4g})", flush=True)
print(f"{differ} points differ")
sys.exit(min(differ, 100))
