#!/bin/bash
# Session 13, H200 call 2: which shape property makes triton_emulation's FP8-block GEMM1 depart from the reference
# on the GPU (it matches bit for bit under the interpreter). tools/a2_deviation.py, one token, varying one thing.
export PYTHONUNBUFFERED=1
t0=$(date +%s)
run() { echo "== $*"; timeout 60 python3 tools/a2_deviation.py --tokens 1 --worst 1 "$@" 2>&1 | head -9; }
{
run --share qwen3-30b-a3b
run --share qwen3-30b-a3b --distinct 128
run --share qwen3-30b-a3b --experts 8
run --share qwen3-30b-a3b --experts 8 --hidden 512 --intermediate 256
run --share qwen3-30b-a3b --experts 8 --hidden 512 --intermediate 256 --top-k 4
run --share qwen3-30b-a3b --experts 8 --hidden 2048 --intermediate 256
run --share qwen3-30b-a3b --experts 8 --hidden 512 --intermediate 768
run --share qwen3-30b-a3b --experts 8 --tokens 64
run --share qwen3-30b-a3b --experts 8 --scheme w_fp8_a_fp8
run --share qwen3-30b-a3b --experts 8 --scheme bf16
run --share qwen3-30b-a3b --experts 8 --backend vllm_fused_moe@0.33.0 2>&1
} > $OUT/isolate.log
echo "total $(( $(date +%s) - t0 )) s" >> $OUT/isolate.log
grep -E "^==|  y |out / bound" $OUT/isolate.log
