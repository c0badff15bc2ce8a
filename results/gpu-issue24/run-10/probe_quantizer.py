"""run-9: triton_emulation's FP8 1x128 activation quantizer against the reference on the GPU, by row width and input
dtype (run-8: its a1 at H >= 1024 differs from the reference, GEMM1 on that a1 is exact)."""
import torch

from harness.backends import load_backend
from reference.formats import E4M3FN
from reference.fp8 import quantize_fp8
from reference.fp8 import Granularity

b = load_backend("triton_emulation")
g = torch.Generator().manual_seed(0)
for rows, cols in ((1, 640), (1, 768), (1, 1024), (1, 2048), (16, 2048), (64, 2048), (3, 4096)):
    x = torch.randn(rows, cols, generator=g).to(torch.bfloat16)
    ref = quantize_fp8(x, E4M3FN, granularity=Granularity.PER_BLOCK, block_shape=(1, 128))
    for name, given in (("fp32 in", x.float().cuda().contiguous()), ("bf16 in", x.cuda().contiguous())):
        codes, s, vals = b._fp8(given, E4M3FN, None, 128, values=True)
        codes, s = codes.cpu(), s.cpu()
        bad_c = (codes != ref.codes).sum().item()
        bad_s = (s != ref.scale).sum().item()
        line = f"{rows}x{cols} {name}: codes differ {bad_c} of {codes.numel()}, scales differ {bad_s} of {s.numel()}"
        if bad_s:
            i = (s != ref.scale).nonzero()[0].tolist()
            line += f"; first scale [{i}] kernel {s[tuple(i)].item()!r} ref {ref.scale[tuple(i)].item()!r}"
        if bad_c:
            i = (codes != ref.codes).nonzero()[0].tolist()
            grp = i[1] // 128
            line += (f"; first code {i}: x {x[tuple(i)].item()!r} kernel {codes[tuple(i)].item()} ref "
                     f"{ref.codes[tuple(i)].item()} (group scale kernel {s[i[0], grp].item()!r} ref "
                     f"{ref.scale[i[0], grp].item()!r}); bad groups {sorted(set(((codes != ref.codes).nonzero()[:, 1] // 128).tolist()))[:20]}")
        print(line, flush=True)

# the MoE path itself on the case's hidden states (qwen3-30b-a3b with 8 experts, one token: run-8's case)
from harness.core.conformance import Shape, case_inputs
from reference.formats import E4M3FN as FMT
from reference.schemes import SCHEMES

x = case_inputs(Shape(8, 2048, 768, 1, 8), 0)[0]
aq = SCHEMES["w_fp8_a_fp8_block"].act
ref = quantize_fp8(x, FMT, granularity=Granularity.PER_BLOCK, block_shape=(1, 128))
v, mode, s = b._fp8_activation(x.cuda().contiguous(), None, aq, FMT)
s = s.cpu()
ref_vals = FMT.values_fp32[ref.codes.long()]
print(f"case hidden states {tuple(x.shape)} {x.dtype} stride {x.stride()}: mode {mode}; scales differ "
      f"{int((s != ref.scale).sum())} of {s.numel()}; values differ {int((v.cpu().float() != ref_vals).sum())}; "
      f"scale ratios kernel/ref {(s / ref.scale).flatten().tolist()}")
xs = x.float()
for grp in range(x.shape[1] // 128):
    amax = xs[:, grp * 128:(grp + 1) * 128].abs().amax().item()
    print(f"  group {grp}: amax {amax!r} ref scale {ref.scale[0, grp].item()!r} kernel {s[0, grp].item()!r}")
