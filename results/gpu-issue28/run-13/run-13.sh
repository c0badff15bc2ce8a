#!/bin/bash
# Issue 28 run-13 (written in session 20 for the next loan; H200, carry .third_party), each part one call:
#   PART=check bash results/gpu-issue28/run-13/run-13.sh   (~3 min)
#   PART=bench bash results/gpu-issue28/run-13/run-13.sh   (~8 min)
#   PART=persist bash results/gpu-issue28/run-13/run-13.sh (~4 min)
# Built in session 20 after its loan, compiled for sm90 on the CPU, not yet run:
# - NVFP4 block factors by an exponent add where every scale is normal (MOE_CONFORMANCE_NVFP4_EXPONENT_ADD=1,
#   triton_kernels._nvfp4_factor_words' NORMAL; 16 SASS fewer a K step in both kernels);
# - the defaults of session 20 never timed in one make bench run: pdl at every decode point (1 where GEMM2's weights
#   fit in 25 MB, else 2), the one-wave rows rule, quantized activations through the Gluon kernel.
# check: conformance and special values of triton_bitplace and triton_bitplace_gluon with the exponent add on (the
#   reference is the oracle: both kernels share the helper); NVFP4 bit for bit Gluon against moe_gemm_kernel with it
#   on; the sanitizers.
# bench: every issue-28 target from one make bench run with the defaults (the exponent add off), then the NVFP4 decode
#   rows with it on.
export PYTHONUNBUFFERED=1
HOST=$(python3 -m harness platforms --host)
FILTER='(gpt-oss-120b or kimi-k2) and (T1/ or T8/ or T64/ or T8192/) and ((w_mxfp4/ or w_nvfp4/ or w_nvfp4_a_nvfp4/) and (triton_bitplace_gluon and not T8192/ or triton_bitplace and not triton_bitplace_gluon and T8192/) or bf16/ and (triton_emulation or torch_grouped_mm) or triton_kernels_ogs and not T8192/)'
case "${PART:-check}" in
persist) ;;
check)
  MOE_CONFORMANCE_NVFP4_EXPONENT_ADD=1 timeout 200 python3 -m pytest -p no:cacheprovider -q -n 8 -m $HOST \
    suites/test_conformance.py suites/test_special_values.py -k "triton_bitplace and nvfp4" > $OUT/conformance.log 2>&1
  echo "conformance, NVFP4 with the exponent add: rc=$? $(tail -1 $OUT/conformance.log)"
  grep -E "^(FAILED|ERROR)" $OUT/conformance.log | head -5
  for case in "w_nvfp4 gpt-oss-120b" "w_nvfp4_a_nvfp4 kimi-k2"; do
    set -- $case
    MOE_CONFORMANCE_NVFP4_EXPONENT_ADD=1 timeout 100 python3 tools/bit_for_bit.py --model $2 --scheme $1 \
      --tokens 1 8 64 --ref triton_bitplace --ref-config num_stages=3 --backend triton_bitplace_gluon \
      --config num_stages=4 --sweep split_k=1,3 --sweep pdl=0,2 --replays 5 >> $OUT/smoke.log 2>&1
    echo "$case: rc=$? (the number of points that differ)"
  done
  for tool in memcheck racecheck; do
    MOE_CONFORMANCE_NVFP4_EXPONENT_ADD=1 timeout 110 compute-sanitizer --tool $tool python3 tools/sanitize_kernels.py \
      > $OUT/$tool.log 2>&1
    echo "$tool: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/$tool.log | tail -1)"
  done
  ;;
bench)
  t0=$(date +%s)
  timeout 420 make bench PY=python3 SETUP= BENCH_ARGS="--durations=12 -k \"$FILTER\"" > $OUT/bench.log 2>&1
  echo "bench: rc=$? $(( $(date +%s) - t0 )) s"; tail -2 $OUT/bench.log
  mkdir -p $OUT/bench && cp bench/table.md bench/results.json bench/targets.md $OUT/bench/ 2>/dev/null
  grep -E "^\| " bench/targets.md | cut -c1-180
  MOE_CONFORMANCE_NVFP4_EXPONENT_ADD=1 timeout 120 make bench PY=python3 SETUP= BENCH_ARGS="-k \"(gpt-oss-120b or kimi-k2) and (T1/ or T8/ or T64/) and (w_nvfp4/ or w_nvfp4_a_nvfp4/) and triton_bitplace_gluon\"" \
    > $OUT/bench-add.log 2>&1
  echo "bench, exponent add: rc=$?"
  mkdir -p $OUT/bench-add && cp bench/table.md bench/results.json $OUT/bench-add/ 2>/dev/null
  grep -E "^\| " bench/table.md
  ;;
esac
# PART=persist (~4 min): the persistent grid (tiles' persistent 1: each GEMM as the programs that fit at once, one ring
# a program across its work items, the next item's loads under the last one's MMAs; opt-in): bit for bit against
# triton_bitplace (split 1 / 3, pdl 0 / 2, 64 / 128 rows, graph replays), then timed against the plain grid at 1 / 8 /
# 64 tokens on both models (ring 4, schedule 0, GEMM2 128 rows, pdl 2; one token at the one-wave rule's rows)
if [ "${PART}" = persist ]; then
  for case in "w_mxfp4 gpt-oss-120b" "w_nvfp4 kimi-k2"; do
    set -- $case
    timeout 100 python3 tools/bit_for_bit.py --model $2 --scheme $1 --tokens 1 8 64 --ref triton_bitplace \
      --ref-config num_stages=3 --backend triton_bitplace_gluon --config num_stages=4 --config persistent=1 \
      --sweep split_k=1,3 --sweep pdl=0,2 --sweep block_n=64,128 --replays 3 >> $OUT/persist-smoke.log 2>&1
    echo "$case: rc=$? (the number of points that differ)"
  done
  W="--where num_stages=4 --where mma_overlap=0 --where w2_mma_overlap=0 --where w2_block_n=128 --where pdl=2"
  timeout 120 python3 tools/tune_moe.py --case gpt-oss-120b/w_mxfp4/triton_bitplace_gluon \
    --case kimi-k2/w_mxfp4/triton_bitplace_gluon --tokens 8 64 $W --where block_n=64 --where split_k=1 \
    --where persistent=0,1 > $OUT/persist-t8-t64.log 2>&1; mv $OUT/tune.json $OUT/persist-t8-t64.json
  timeout 60 python3 tools/tune_moe.py --case kimi-k2/w_mxfp4/triton_bitplace_gluon --tokens 1 $W --where block_n=128 \
    --where split_k=2 --where persistent=0,1 > $OUT/persist-t1.log 2>&1; mv $OUT/tune.json $OUT/persist-t1.json
  grep -hE "^  T=|best" $OUT/persist-*.log | sed -E "s/'block_m'.*'persistent'/persistent/"
  timeout 100 compute-sanitizer --tool memcheck python3 tools/sanitize_kernels.py \
    > $OUT/persist-memcheck.log 2>&1
  echo "memcheck: rc=$? $(grep -E 'ERROR SUMMARY' $OUT/persist-memcheck.log | tail -1)"
fi
