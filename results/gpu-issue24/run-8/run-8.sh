#!/bin/bash
# Session 13, H200 call 3: triton_emulation FP8-block GEMM1 at H = 2048 (run-7: wrong at H 2048, right at 512):
# is the kernel's a1 right, is GEMM1 on it right, and does it depend on the tiles / pipelining.
export PYTHONUNBUFFERED=1
t0=$(date +%s)
run() { echo "== $*"; timeout 60 python3 tools/a2_deviation.py --share qwen3-30b-a3b --experts 8 --tokens 1 --worst 1 "$@" 2>&1 | head -9; }
{
run
run --tiles '{"num_stages": 1}'
run --tiles '{"block_k": 64}'
run --tiles '{"block_n": 32, "num_warps": 4}'
run --hidden 1024
run --hidden 1024 --intermediate 256
run --hidden 640 --intermediate 256
} > $OUT/isolate2.log
echo "total $(( $(date +%s) - t0 )) s" >> $OUT/isolate2.log
grep -E "^==|tiles|  y |  a1|out / bound" $OUT/isolate2.log
