"""How exactly does torch._scaled_mm accumulate FP8 products on this GPU? Compares its fp32 output with
the float64 product of the same FP8 codes, in units of sum|a||w| (the GEMM's error scale): fp32
accumulation gives ~K * 2^-24 at most; a narrower accumulator shows up as a larger ratio."""
import torch

torch.manual_seed(0)
dev = "cuda"
for k in (128, 512, 2048, 8192):
    a = (torch.randn(64, k, device=dev) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    w = (torch.randn(256, k, device=dev) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    one = torch.tensor(1.0, device=dev)
    exact = a.double() @ w.double().t()
    scale = a.double().abs() @ w.double().abs().t()
    for fast in (False, True):
        out = torch._scaled_mm(a, w.t(), scale_a=one, scale_b=one, out_dtype=torch.float32, use_fast_accum=fast)
        ratio = ((out.double() - exact).abs() / scale).max().item()
        print(f"K={k:<5} fast_accum={fast!s:<5} max |err| / sum|a||w| = {ratio:.2e}  "
              f"(fp32 accumulation bound gamma_K = {k * 2**-24:.2e}; 2^-14 = {2**-14:.2e})")
