#!/bin/bash
# Issue 28 run-11 (written in session 19 for the next loan; H200, carry .third_party), each part one call:
#   PART=smoke bash results/gpu-issue28/run-11/run-11.sh   (~3 min)
#   PART=check bash results/gpu-issue28/run-11/run-11.sh   (~3 min)
#   PART=bench bash results/gpu-issue28/run-11/run-11.sh   (~5 min)
# Built in session 19 after its loan, compiled for sm90 on the CPU, not yet run:
# - quantized activations through the Gluon kernel (MOE_CONFORMANCE_GLUON_QUANTIZED_ACT=1: NVFP4 / MXFP4 W4A4, static
#   FP8 W4A8; the epilogue kernels apply the one fp32 scale and quantize GEMM2's NVFP4 input), for the NVFP4 W4A4
#   target (1.24-1.35x MXFP4 in session 19 through moe_gemm_kernel);
# - `pdl` where GEMM2's weights of the call are at most 25 MB (GLUON_PDL_BYTES; run-10 ran the one-wave rule).
# smoke: W4A4 / W4A8 bit for bit against triton_bitplace (same split), with and without pdl, graph replays.
# check: conformance + special values of triton_bitplace_gluon with quantized activations on; the sanitizers
#   (tools/sanitize_kernels.py now has W4A4 and pdl cases).
# bench: the W4A4 rows of both backends with the switch on, and the one-token MXFP4 rows with block_n 64 / 128 (session
#   18's sweep had Kimi-K2 one token at 88.2 us with block_n 128 split 2 against 96.7: the one target point missed
#   against triton_kernels' GEMMs, 87.8 us).
export PYTHONUNBUFFERED=1
export MOE_CONFORMANCE_GLUON_QUANTIZED_ACT=1
HOST=$(python3 -m harness platforms --host)
case "${PART:-smoke}" in
smoke)
  for case in "w_nvfp4_a_nvfp4 gpt-oss-120b" "w_nvfp4_a_nvfp4 kimi-k2" "w_mxfp4_a_mxfp4 gpt-oss-120b"; do
    set -- $case
    timeout 150 python3 tools/bit_for_bit.py --model $2 --scheme $1 --tokens 1 8 64 --ref triton_bitplace \
      --ref-config num_stages=3 --backend triton_bitplace_gluon --config num_stages=4 --sweep split_k=1,3 \
      --sweep pdl=0,1 --replays 10 >> $OUT/smoke.log 2>&1
    echo "$case: rc=$? (the number of points that differ)"
  done
  echo "smoke: $(grep -c 'bit for bit True' $OUT/smoke.log) True, $(grep -c 'bit for bit False' $OUT/smoke.log) False, $(grep -c 'bitplace_partials' $OUT/smoke.log) through the Gluon kernel"
  grep -E "False|Error" $OUT/smoke.log | head
  ;;
check)
  timeout 200 python3 -m pytest -p no:cacheprovider -q -n 8 -m $HOST suites/test_conformance.py \
    suites/test_special_values.py -k "triton_bitplace_gluon" > $OUT/conformance.log 2>&1
  echo "conformance, triton_bitplace_gluon with quantized activations: rc=$? $(tail -1 $OUT/conformance.log)"
  grep -E "^(FAILED|ERROR)" $OUT/conformance.log | head -5
  for tool in memcheck synccheck racecheck; do
    timeout 110 compute-sanitizer --tool $tool python3 tools/sanitize_kernels.py > $OUT/$tool.log 2>&1
    echo "$tool: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/$tool.log | tail -1)"
  done
  ;;
bench)
  t0=$(date +%s)
  timeout 300 make bench PY=python3 SETUP= BENCH_ARGS="-k \"(gpt-oss-120b or kimi-k2) and (T1/ or T8/ or T64/) and (w_mxfp4/ or w_nvfp4_a_nvfp4/) and triton_bitplace\"" > $OUT/bench.log 2>&1
  echo "bench: rc=$? $(( $(date +%s) - t0 )) s"
  mkdir -p $OUT/bench && cp bench/table.md bench/results.json bench/targets.md $OUT/bench/ 2>/dev/null
  grep -E "^\| " bench/table.md | head -40
  t0=$(date +%s)
  MOE_CONFORMANCE_GLUON_BLOCK_N=128 timeout 150 make bench PY=python3 SETUP= BENCH_ARGS="-k \"(gpt-oss-120b or kimi-k2) and T1/ and w_mxfp4/ and triton_bitplace_gluon\"" > $OUT/bench-bn128.log 2>&1
  echo "bench block_n 128: rc=$? $(( $(date +%s) - t0 )) s"
  mkdir -p $OUT/bench-bn128 && cp bench/table.md bench/results.json $OUT/bench-bn128/ 2>/dev/null
  grep -E "^\| " bench/table.md
  ;;
esac
