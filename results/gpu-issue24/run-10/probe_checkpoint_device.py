"""run-9: make_checkpoint(device="cuda") against make_checkpoint() moved to the GPU, tensor by tensor, bit for bit."""
import dataclasses

import torch

from reference.checkpoints import make_checkpoint

for scheme in ("bf16", "w_fp8_a_fp8", "w_fp8_a_fp8_block", "w_mxfp4", "w_nvfp4_a_nvfp4", "w_mxfp4_a_mxfp4"):
    a = make_checkpoint(scheme, "SILU", 8, 256, 256, seed=3, with_bias=True, distinct_experts=4).to("cuda")
    b = make_checkpoint(scheme, "SILU", 8, 256, 256, seed=3, with_bias=True, distinct_experts=4, device="cuda")
    diffs = []
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        for sub in ("data", "scale", "global_scale") if hasattr(x, "data") and not torch.is_tensor(x) else (None,):
            xs, ys = (x, y) if sub is None else (getattr(x, sub), getattr(y, sub))
            if torch.is_tensor(xs):
                same = xs.device == ys.device and torch.equal(xs.view(torch.uint8) if xs.dtype.itemsize == 1 else xs, ys.view(torch.uint8) if ys.dtype.itemsize == 1 else ys)
                if not same:
                    diffs.append(f"{f.name}.{sub}" if sub else f.name)
    print(f"{scheme}: {'identical' if not diffs else 'DIFFER ' + ', '.join(diffs)}", flush=True)
