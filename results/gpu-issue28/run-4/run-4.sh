#!/bin/bash
# Issue 28 run-4 (written in session 15 for the next loan, H200, carry .third_party): block factors built once as
# bf16x2 words (MOE_CONFORMANCE_BITPLACE_DUP_FACTORS=1; K loop counted on the CPU: MXFP4 462 -> 446, NVFP4
# 560 -> 528 SASS): its bit-for-bit test against the default and triton_bitplace's conformance with it on sm90,
# memcheck (tools/sanitize_kernels.py runs it), then the decode rows with and without it in one call. Also compiled:
# the W4A4 epilogue quantization without split-K (session 15, after run-3), in the same bit-for-bit test file.
export PYTHONUNBUFFERED=1
HOST=$(python3 -m harness platforms --host)
timeout 90 python3 -m pytest -p no:cacheprovider -q suites/test_fp4_bits.py -k "bf16x2_words or next_step" > $OUT/dup-test.log 2>&1
echo "dup-factors and folded-epilogue bit-for-bit tests: $(tail -1 $OUT/dup-test.log)"
MOE_CONFORMANCE_BITPLACE_DUP_FACTORS=1 timeout 120 python3 -m pytest -p no:cacheprovider -q -n 8 -m $HOST \
  suites/test_conformance.py suites/test_special_values.py suites/test_fp4_bits.py -k "bitplace and not hypothesis" \
  > $OUT/conformance-dup.log 2>&1
echo "conformance dup_factors=1: $(tail -1 $OUT/conformance-dup.log)"
timeout 90 compute-sanitizer --tool memcheck python3 tools/sanitize_kernels.py > $OUT/memcheck.log 2>&1
echo "memcheck: rc=$? $(grep -E 'ERROR SUMMARY' $OUT/memcheck.log)"
for d in 0 1; do
  MOE_CONFORMANCE_BITPLACE_DUP_FACTORS=$d timeout 150 make bench PY=python3 SETUP= BENCH_ARGS='-k "(gpt-oss-120b or kimi-k2) and (T1/ or T8/ or T64/) and (w_mxfp4/ or w_nvfp4/ or w_nvfp4_a_nvfp4/) and triton_bitplace"' \
    > $OUT/bench-dup-$d.log 2>&1
  echo "bench dup_factors=$d: rc=$?"
  mkdir -p $OUT/bench-dup-$d && cp bench/table.md $OUT/bench-dup-$d/ 2>/dev/null
  grep -E "^\| (gpt-oss|kimi)" bench/table.md
done
