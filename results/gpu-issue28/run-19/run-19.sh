#!/bin/bash
# Issue 28 run-19 (session 23; H200, carry .third_party), each part one call:
#   PART=persist bash results/gpu-issue28/run-19/run-19.sh   (~6 min)
#   PART=bench   bash results/gpu-issue28/run-19/run-19.sh   (~6 min)
# persist: moe_gemm_kernel's persistent grid (tiles' persistent: that many programs a multiprocessor, each running
# tiles in turn in one flattened loop, the next tile's loads issued during this one's last steps). Bit for bit against
# the plain grid at 2048 tokens on both models (bf16 prefill row, MXFP4 row with tails, NVFP4 W4A4 row), memcheck of
# tools/sanitize_kernels.py (its persistent cases), then tools/tune_moe.py --prefill at 8192 tokens, the rows' tiles
# with persistent 0 / 1 / 2 (/ 3), bf16 also with GEMM2 at 256 columns.
export PYTHONUNBUFFERED=1
BF16="block_m=128 block_n=128 block_k=64 num_warps=8 num_stages=3 group_m=8 tma=2"
MX="block_m=128 block_n=64 block_k=128 num_warps=4 num_stages=3 group_m=8 tail_m=64"
NV="block_m=64 block_n=64 block_k=128 num_warps=4 num_stages=3 group_m=8"
cfg() { for kv in $2; do echo -n " --$1 $kv"; done; }
case "${PART:-persist}" in
persist)
  for model in gpt-oss-120b kimi-k2; do
    for spec in "bf16|triton_emulation|$BF16|persistent=1,2" "w_mxfp4|triton_bitplace|$MX|persistent=1,2,3" \
                "w_nvfp4_a_nvfp4|triton_bitplace|$NV|persistent=2,3"; do
      IFS='|' read scheme be tiles sweep <<< "$spec"
      timeout 100 python3 tools/bit_for_bit.py --model $model --scheme $scheme --tokens 2048 --ref $be \
        $(cfg ref-config "$tiles") --backend $be $(cfg config "$tiles") --sweep $sweep >> $OUT/bfb.log 2>&1
      echo "$model $scheme $sweep: rc=$? (points that differ)"
    done
  done
  tail -30 $OUT/bfb.log
  timeout 120 compute-sanitizer --tool memcheck python3 tools/sanitize_kernels.py > $OUT/memcheck.log 2>&1
  echo "memcheck: rc=$?"; grep -E "persistent|ERROR SUMMARY" $OUT/memcheck.log
  W="--where block_m=128 --where block_n=128 --where num_warps=8 --where num_stages=3 --where group_m=8 --where tma=2"
  timeout 150 python3 tools/tune_moe.py --prefill --case gpt-oss-120b/bf16/triton_emulation \
    --case kimi-k2/bf16/triton_emulation $W --where tail_m=0 --where persistent=0,1 --where w2_block_n=0,256 \
    > $OUT/tune-bf16.log 2>&1
  echo "tune bf16: rc=$?"; grep "T=8192" $OUT/tune-bf16.log | sed 's/block_m.*group_m=8, //'
  W="--where block_m=128 --where num_stages=3 --where group_m=8 --where tma=0"
  timeout 170 python3 tools/tune_moe.py --prefill --case gpt-oss-120b/w_mxfp4/triton_bitplace \
    --case kimi-k2/w_mxfp4/triton_bitplace $W --where tail_m=32,64 --where persistent=0,1,2,3 > $OUT/tune-mx.log 2>&1
  echo "tune mxfp4: rc=$?"; grep "T=8192" $OUT/tune-mx.log | sed 's/block_m.*group_m=8, //'
  ;;
bench)
  bash results/gpu-issue28/run-14/bench.sh
  ;;
esac
