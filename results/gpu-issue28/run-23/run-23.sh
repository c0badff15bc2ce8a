#!/bin/bash
# Issue 28 run-23 (session 25 wrote it): the bf16 prefill loop warp-specialized by Triton (tiles' warp_spec: both
# operands by TMA, descriptors made on the device, a producer warpgroup and two consumer warpgroups). H200, carry
# .third_party; PART may name several parts, run in turn in one call (PART="check timeline": ~6 min).
#   PART=check  ~4 min: bit for bit warp_spec 1 (4 warps) against the 8-warp TMA loop (tma 1) at 2048 tokens on both
#               models (gpt-oss-120b: gate and up rows interleaved, read as row pairs; Kimi-K2: halves); conformance and
#               special values with the row fixed at every size (prefill_backends.py); memcheck and synccheck of
#               tools/sanitize_kernels.py (its warp_spec cases)
#   PART=tune   ~3 min: tools/tune_moe.py --prefill, bf16, both models: tma 1 / 2, warp_spec 0 / 1, 3 / 4 stages,
#               4 / 8 warps, GEMM2 at 256 columns (the row)
#   PART=bench  ~3 min: make bench's bf16 prefill rows with the table's row, then with MOE_CONFORMANCE_BF16_WARP_SPEC=1
#   PART=race   ~1 min: tma128_race.py again, then tma128_prefill.py (TMA activations at 128 rows, 2 / 4 stages, timed
#               as tune_moe times)
#   PART=inline ~5 min: short blocks in the GEMM's one launch (tiles' inline_tails, tail_m = block_m / 2): bit for bit
#               against two launches (MXFP4) and against no tails (bf16) at 2048 tokens on both models; then timed at
#               8192 tokens by tune_moe --prefill: bf16 (the row, tail_m 64 two launches, inline), MXFP4 (tail_m 0 / 32
#               / 64, inline 64), NVFP4 W4A4 (64-row row, 128 rows with inline 64-row tails)
#   PART=timeline ~1.5 min: tools/chain_timeline.py at one token (gpt-oss-120b MXFP4 / NVFP4 / NVFP4 W4A4, Kimi-K2
#               MXFP4): where run-22's NVFP4 W4A4 one-token forward (45.5 us) loses the ~4 us that its kernels' sum
#               (41.3 us) does not account for, while NVFP4 W4A16's sum is its wall time (39.1 us)
export PYTHONUNBUFFERED=1
here=$(dirname "$0")
HOST=$(python3 -m harness platforms --host)
cfg() { for kv in $2; do echo -n " --$1 $kv"; done; }
ROW="block_m=128 block_n=128 block_k=64 num_stages=4 group_m=8 tma=1 w2_block_n=256"
for part in ${PART:-check}; do
case $part in
  check)
    for model in gpt-oss-120b kimi-k2; do
      timeout 120 python3 tools/bit_for_bit.py --model $model --scheme bf16 --tokens 2048 --ref triton_emulation \
        $(cfg ref-config "$ROW num_warps=8") --backend triton_emulation $(cfg config "$ROW num_warps=4") \
        --sweep warp_spec=1 >> $OUT/bfb.log 2>&1
      echo "bf16 $model warp_spec 1: rc=$? (points that differ)"
    done
    cat $OUT/bfb.log | grep -v Warning
    PYTHONPATH=$here timeout 200 python3 -m pytest -p no:cacheprovider -q -n 8 -m $HOST \
      --backend prefill_backends:emulation_warp_spec suites/test_conformance.py suites/test_special_values.py \
      -k "bf16" > $OUT/conformance.log 2>&1
    echo "conformance, the warp-specialized row at every size: rc=$? $(tail -1 $OUT/conformance.log)"
    grep -E "^(FAILED|ERROR)" $OUT/conformance.log | head -5
    for tool in memcheck synccheck; do
      timeout 150 compute-sanitizer --tool $tool python3 tools/sanitize_kernels.py > $OUT/$tool.log 2>&1
      echo "$tool: rc=$?"; grep -E "ERROR SUMMARY|warp_spec" $OUT/$tool.log
    done ;;
  tune)
    timeout 300 python3 tools/tune_moe.py --prefill --case gpt-oss-120b/bf16/triton_emulation \
      --case kimi-k2/bf16/triton_emulation --where block_m=128 --where block_n=128 --where group_m=8 --where tail_m=0 \
      --where persistent=0 --where tma=1,2 --where num_warps=4,8 --where num_stages=3,4 --where w2_block_n=256 \
      > $OUT/tune.log 2>&1
    echo "tune: rc=$?"; grep -v Warning $OUT/tune.log | tail -30 ;;
  bench)
    FILTER='(gpt-oss-120b or kimi-k2) and T8192/ and bf16/ and triton_emulation'
    for on in 0 1; do
      MOE_CONFORMANCE_BF16_WARP_SPEC=$on timeout 200 make bench PY=python3 SETUP= BENCH_ARGS="-k \"$FILTER\"" \
        > $OUT/bench-ws-$on.log 2>&1
      echo "warp_spec row $on: rc=$?"; tail -1 $OUT/bench-ws-$on.log
      cp bench/table.md $OUT/table-ws-$on.md; cp bench/targets.md $OUT/targets-ws-$on.md
    done
    grep -h "T=8192 bf16" $OUT/targets-ws-*.md | cut -c1-200 ;;
  race)
    timeout 100 python3 $here/tma128_race.py 2>&1 | grep -v Warning | tee $OUT/tma128_race.log
    timeout 150 python3 $here/tma128_prefill.py 2>&1 | grep -v Warning | tee $OUT/tma128_prefill.log ;;
  inline)
    BF="block_m=128 block_n=128 block_k=64 num_warps=8 num_stages=4 group_m=8 tma=2 w2_block_n=256"
    FP="block_m=128 block_n=64 block_k=128 num_warps=4 num_stages=3 group_m=8 tail_m=64"
    for model in gpt-oss-120b kimi-k2; do
      timeout 100 python3 tools/bit_for_bit.py --model $model --scheme bf16 --tokens 2048 --ref triton_emulation \
        $(cfg ref-config "$BF") --backend triton_emulation $(cfg config "$BF tail_m=64") --sweep inline_tails=1 \
        >> $OUT/bfb-inline.log 2>&1
      echo "bf16 $model inline tails: rc=$?"
      timeout 100 python3 tools/bit_for_bit.py --model $model --scheme w_mxfp4 --tokens 2048 --ref triton_bitplace \
        $(cfg ref-config "$FP") --backend triton_bitplace $(cfg config "$FP") --sweep inline_tails=1 \
        >> $OUT/bfb-inline.log 2>&1
      echo "w_mxfp4 $model inline tails: rc=$?"
    done
    grep -v Warning $OUT/bfb-inline.log
    W="--where block_m=128 --where group_m=8 --where persistent=0"
    timeout 150 python3 tools/tune_moe.py --prefill --case gpt-oss-120b/bf16/triton_emulation \
      --case kimi-k2/bf16/triton_emulation $W --where block_n=128 --where tma=2 --where num_warps=8 \
      --where num_stages=4 --where w2_block_n=256 --where warp_spec=0 --where tail_m=0,64 > $OUT/tune-inline-bf16.log 2>&1
    echo "tune bf16: rc=$?"; grep -v Warning $OUT/tune-inline-bf16.log | tail -12
    timeout 200 python3 tools/tune_moe.py --prefill --case gpt-oss-120b/w_mxfp4/triton_bitplace \
      --case kimi-k2/w_mxfp4/triton_bitplace --case kimi-k2/w_nvfp4_a_nvfp4/triton_bitplace $W --where block_n=64 \
      --where num_warps=4 --where num_stages=3 --where tma=0 --where mma_steps=1 > $OUT/tune-inline-fp4.log 2>&1
    echo "tune FP4: rc=$?"; grep -v Warning $OUT/tune-inline-fp4.log | tail -16 ;;
  timeline)
    timeout 150 python3 tools/chain_timeline.py --model gpt-oss-120b --tokens 1 --backend triton_bitplace_gluon \
      --scheme w_mxfp4 --scheme w_nvfp4 --scheme w_nvfp4_a_nvfp4 2>&1 | grep -v Warning | tee $OUT/timeline.log
    timeout 100 python3 tools/chain_timeline.py --model kimi-k2 --tokens 1 --backend triton_bitplace_gluon \
      --scheme w_mxfp4 2>&1 | grep -v Warning | tee -a $OUT/timeline.log ;;
esac
done
