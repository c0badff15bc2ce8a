"""Session 25, a compile-only experiment (no GPU): can Triton's own sm90 warp specialization (tl.range(...,
warp_specialize=True)) take a K loop that loads FP4 codes (uint8) and bf16 activations by TMA descriptors made in the
kernel and decodes the codes in the consumers before a weights-first dot? A toy decode (codes << 6 as bf16 bits), not
triton_bitplace's. Prints, per tile (BN weight rows x BM tokens), the threads and setmaxnreg budgets of the compiled
kernel, or the failure. Output of this session: README.md beside it.
    python3 results/cpu-issue28/ws/ws_fp4_compile.py                            # the venv's Triton (3.9)
    PYTHONPATH=/tmp/t36lib python3 results/cpu-issue28/ws/ws_fp4_compile.py     # Triton 3.6 (the H200 image's)
"""
import triton, triton.language as tl, sys, re
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource

@triton.jit
def mm(a_ptr, w_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, WS: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    w_desc = tl.make_tensor_descriptor(w_ptr, shape=[N, K // 2], strides=[K // 2, 1], block_shape=[BN, BK // 2])
    acc = tl.zeros((BN, BM), dtype=tl.float32)
    for k in tl.range(0, K, BK, warp_specialize=WS):
        a = a_desc.load([pid_m * BM, k])
        codes = w_desc.load([pid_n * BN, k // 2]).to(tl.int32)
        lo = (codes & 0xF) << 6
        hi = (codes >> 4) << 6
        v = tl.reshape(tl.join(lo, hi), (BN, BK))
        w = (v.to(tl.int16)).to(tl.bfloat16, bitcast=True)
        acc = tl.dot(w, a.T, acc)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    tl.store(c_ptr + offs_n[:, None] * M + offs_m[None, :], acc.to(tl.bfloat16))

sig = {"a_ptr": "*bf16", "w_ptr": "*u8", "c_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32",
       "BM": "constexpr", "BN": "constexpr", "BK": "constexpr", "WS": "constexpr"}
for bn, bm in ((64, 128), (128, 128), (128, 64)):
    try:
        k = triton.compile(ASTSource(mm, sig, constexprs={"BM": bm, "BN": bn, "BK": 128, "WS": True}), target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, num_stages=3))
        ptx = k.asm["ptx"]
        print(triton.__version__, "BN", bn, "BM", bm, re.findall(r"\.reqntid \d+", ptx), sorted(set(re.findall(r"setmaxnreg\S*\s+\d+", ptx))), ptx.count("wgmma.mma_async"))
    except Exception as e:
        print(triton.__version__, "BN", bn, "BM", bm, "FAILED", str(e)[:200])
