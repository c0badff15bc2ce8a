#!/bin/bash
# Issue 28 run-28 (session 28; H200, carry .third_party). PART may name several parts.
#   PART=bfb     ~2.5 min: NVFP4 W4A16's new prefill row (128 rows, fit_tail_m; run-27 PART=nvfp4) bit for bit against
#                its 64-row row at 100 and 600 tokens (8 experts: 50-600 rows an expert, tail blocks of 32 and 64)
#   PART=bench   ~4 min: make bench's 8192-token rows (run-24's PART=bench) under the judged-lower rule, at this tree
#   PART=finish  ~4 min: what run-27's PART=check ran out of time for: fit_pairs_bits on Kimi-K2, memcheck over
#                tools/sanitize_kernels.py to its end (run-27's conformance passed: 212 passed, 6 skipped)
#   PART=stages  ~3.5 min: NVFP4 GEMM1 at 128 rows takes 114.0 KB of shared memory at 3 stages, 1 KB over what two
#                programs an SM may each take (MXFP4's 113.0 KB: 2 programs/SM, NVFP4 1): 2 stages (73 KB) or 128
#                weight rows on 8 warps against the 3-stage row, both models, W4A16 and W4A4, at each model's tail
export PYTHONUNBUFFERED=1
HOST=$(python3 -m harness platforms --host)
for part in ${PART:-bfb}; do
case $part in
  bfb)
    for m in gpt-oss-120b kimi-k2; do
      timeout 80 python3 tools/bit_for_bit.py --model $m --scheme w_nvfp4 --tokens 100 600 --ref triton_bitplace \
        --ref-config block_m=64 --ref-config num_stages=3 --ref-config group_m=8 --ref-config tail_m=32 \
        --backend triton_bitplace --config block_m=128 --config num_stages=3 --config group_m=8 --sweep tail_m=32,64
      echo "$m: rc=$?"
    done 2>&1 | grep -v -i warn | tee $OUT/bfb.log ;;
  bench)
    PART=bench bash results/gpu-issue28/run-24/run-24.sh ;;
  finish)
    timeout 110 python3 results/gpu-issue28/run-26/fit_pairs_bits.py kimi-k2 2>&1 | grep -v -i warn > $OUT/fit_pairs_bits.log
    echo "fit_pairs_bits: rc=${PIPESTATUS[0]} $(tail -1 $OUT/fit_pairs_bits.log)"
    timeout 180 compute-sanitizer --tool memcheck python3 tools/sanitize_kernels.py > $OUT/memcheck.log 2>&1
    echo "memcheck: rc=$? $(grep -E 'ERROR SUMMARY' $OUT/memcheck.log | tail -1)" ;;
  stages)
    W="--where block_m=128 --where num_stages=2,3 --where group_m=8 --where tma=0 --where persistent=0
       --where mma_steps=1 --where inline_tails=0"
    for mt in gpt-oss-120b:32 kimi-k2:64; do m=${mt%:*}
      mkdir -p $OUT/$m; OUT=$OUT/$m timeout 140 python3 tools/tune_moe.py --tokens 8192 --case $m/w_nvfp4/triton_bitplace \
        --case $m/w_nvfp4_a_nvfp4/triton_bitplace $W --where tail_m=${mt#*:} 2>&1 | grep -v -i warn > $OUT/stages-$m.log
      echo "tune $m: rc=${PIPESTATUS[0]}"; grep -E "T=8192|Error" $OUT/stages-$m.log | cut -c1-260
    done ;;
esac
done
