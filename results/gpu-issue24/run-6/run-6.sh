#!/bin/bash
# Session 13, H200 call 1 (carry .third_party): (A) where triton_emulation's FP8-block path departs from the
# reference at Qwen3-30B-A3B (tools/a2_deviation.py: y, a2, z stage by stage; the worst outputs broken down by the
# a2 scale groups), (B) where a real-model-shape test's time goes (cProfile of `python -m harness model-shapes`).
export PYTHONUNBUFFERED=1
t0=$(date +%s)
for n in 64 1; do
  timeout 150 python3 tools/a2_deviation.py --share qwen3-30b-a3b --scheme w_fp8_a_fp8_block --tokens $n --worst 4 \
    > $OUT/a2-qwen3-30b-T$n.log 2>&1; echo "rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/a2-qwen3-30b-T$n.log
done
timeout 100 python3 tools/a2_deviation.py --backend vllm_fused_moe@0.33.0 --share qwen3-30b-a3b --tokens 64 > $OUT/a2-vllm.log 2>&1
prof() {  # name, then model-shapes arguments
  local name=$1; shift
  local s=$(date +%s)
  timeout 170 python3 -m cProfile -o $OUT/$name.pstats -m harness model-shapes "$@" > $OUT/$name.log 2>&1
  echo "rc=$? wall $(( $(date +%s) - s )) s" >> $OUT/$name.log
  python3 - $OUT/$name.pstats >> $OUT/$name.log 2>&1 <<'PY'
import pstats, sys
s = pstats.Stats(sys.argv[1]); s.sort_stats("cumulative").print_stats(45); s.sort_stats("tottime").print_stats(30)
PY
}
prof prof-gptoss120-bf16 --backend triton_emulation --backend torch_grouped_mm --backend vllm_fused_moe@0.33.0 \
  --model gpt-oss-120b --tp 1 --scheme bf16 --tokens 1 64
prof prof-mixtral-tp8-fp8 --backend torch_fp8 --backend dequantize_all --backend triton_emulation \
  --model mixtral-8x7b --tp 8 --scheme w_fp8_a_fp8 --tokens 1 64
echo "total $(( $(date +%s) - t0 )) s"
tail -n 4 $OUT/*.log
