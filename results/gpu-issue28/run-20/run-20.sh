#!/bin/bash
# Issue 28 run-20 (session 23; H200, carry .third_party; one call, ~8 min): the bf16 prefill row of run-19's sweeps
# (GEMM2 at 256 columns, 4 stages) checked and timed. Bit for bit against GEMM2 at 128 columns / 3 stages at 2048 tokens
# on both models (an N tile's width does not enter the K reduction); conformance and special values with the row fixed
# at every size; then run-14's make bench (every issue-28 target from one run).
export PYTHONUNBUFFERED=1
HOST=$(python3 -m harness platforms --host)
D=results/gpu-issue28/run-20
ROW="block_m=128 block_n=128 block_k=64 num_warps=8 group_m=8 tma=2"
cfg() { for kv in $2; do echo -n " --$1 $kv"; done; }
for model in gpt-oss-120b kimi-k2; do
  timeout 90 python3 tools/bit_for_bit.py --model $model --scheme bf16 --tokens 2048 --ref triton_emulation \
    $(cfg ref-config "$ROW num_stages=3") --backend triton_emulation $(cfg config "$ROW num_stages=4") \
    --sweep w2_block_n=256 >> $OUT/bfb.log 2>&1
  echo "bf16 $model w2_block_n 256: rc=$? (points that differ)"
done
cat $OUT/bfb.log
PYTHONPATH=$D timeout 150 python3 -m pytest -p no:cacheprovider -q -n 8 -m $HOST \
  --backend prefill_backends:emulation_prefill suites/test_conformance.py suites/test_special_values.py \
  -k "bf16" > $OUT/conformance.log 2>&1
echo "conformance, the bf16 prefill row at every size: rc=$? $(tail -1 $OUT/conformance.log)"
grep -E "^(FAILED|ERROR)" $OUT/conformance.log | head -5
mkdir -p $OUT/bench; OUT=$OUT/bench bash results/gpu-issue28/run-14/bench.sh
