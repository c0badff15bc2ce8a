"""Which torch._scaled_mm calls does this GPU's cuBLASLt accept? (kept: it decided torch_fp8's call)"""
import torch

dev = "cuda"
dt = torch.float8_e4m3fn
m, k, n = 48, 512, 512
a = torch.randn(m, k, device=dev).to(dt)
w = torch.randn(4, n, k, device=dev).to(dt)
one = torch.tensor(1.0, device=dev)
variants = {
    "0-d scales, bf16 out": lambda: torch._scaled_mm(a, w[1].t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
    "0-d scales, fp32 out": lambda: torch._scaled_mm(a, w[1].t(), scale_a=one, scale_b=one, out_dtype=torch.float32),
    "(1,1) scales, bf16": lambda: torch._scaled_mm(a, w[1].t(), scale_a=one.reshape(1, 1), scale_b=one.reshape(1, 1), out_dtype=torch.bfloat16),
    "fresh contiguous b": lambda: torch._scaled_mm(a, w[1].contiguous().t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
    "rowwise scales bf16": lambda: torch._scaled_mm(a, w[1].t(), scale_a=torch.ones(m, 1, device=dev), scale_b=torch.ones(1, n, device=dev), out_dtype=torch.bfloat16),
    "uint8 view b": lambda: torch._scaled_mm(a, w.view(torch.uint8).view(dt)[1].t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
    "fast accum": lambda: torch._scaled_mm(a, w[1].t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=True),
}
for name, fn in variants.items():
    try:
        out = fn()
        torch.cuda.synchronize()
        ref = (a.float() @ w[1].float().t())
        print(f"OK   {name}: max rel err {float(((out.float() - ref).abs().max() / ref.abs().max())):.2e}")
    except Exception as exc:
        print(f"FAIL {name}: {str(exc)[:120]}")
