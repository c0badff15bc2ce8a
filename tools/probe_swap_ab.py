import sys, torch
sys.path.insert(0, ".")
from harness.backends import load_backend
from harness.bench import MODEL_SHAPES, capture, median_ms, device_checkpoint, routed_inputs, weight_bytes, copy_bandwidth
from harness.conformance import Shape, reference_run, compare_backend
bw = copy_bandwidth()
b = load_backend("triton_dot_scaled")
for swap in (False, True):
    b.swap_ab = swap
    for sh in ("gpt-oss-120b", "kimi-k2"):
        s = MODEL_SHAPES[sh]
        ck, inp, out, tr = reference_run("w_mxfp4", s.activation, "e4m3fn", Shape(8, s.hidden_size, s.intermediate_size, 16, 4), 0)
        print("swap", swap, sh, compare_backend(b, ck, inp, out, tr, sh).message()[:100], flush=True)
for sh in ("gpt-oss-120b", "kimi-k2"):
    s = MODEL_SHAPES[sh]
    ck = device_checkpoint(s, "w_mxfp4", "cuda"); p = b.prepare(ck)
    for t in (1, 8, 64):
        x, w, ids = routed_inputs(s, t, "cuda"); w = w.float().contiguous()
        res = {}
        for swap in (False, True):
            b.swap_ab = swap
            r, o = capture(lambda: b.launch(p, x, w, ids)); ms = median_ms(r, 10); res[swap] = (ms, o.clone())
        d = (res[True][1].float() - res[False][1].float()).abs().max().item()
        print(sh, t, "noswap %.1f us (%.1f%%)" % (res[False][0]*1e3, 100*weight_bytes(ck, ids)/(res[False][0]/1e3)/bw),
              "swap %.1f us (%.1f%%)" % (res[True][0]*1e3, 100*weight_bytes(ck, ids)/(res[True][0]/1e3)/bw), "maxdiff", d, flush=True)
    del p, ck; torch.cuda.empty_cache()
