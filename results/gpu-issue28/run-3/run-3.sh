#!/bin/bash
# Issue 28 run-3 (session 15, H200, carry .third_party): the one-token rows after GEMM2's split-K epilogue was
# folded into the top-k sum (one launch fewer), and the fold's bit-for-bit test compiled; then issue 24/25's run-9
# (the two failures of nightly run-8, fixed) with what is left of the call.
export PYTHONUNBUFFERED=1
t0=$(date +%s)
timeout 60 python3 -m pytest -p no:cacheprovider -q suites/test_fp4_bits.py -k "folded_into or k_tails" > $OUT/fold-test.log 2>&1
echo "fold test: $(tail -1 $OUT/fold-test.log) $(( $(date +%s) - t0 )) s"
t0=$(date +%s)
timeout 150 make bench PY=python3 SETUP= BENCH_ARGS='-k "(gpt-oss-120b or kimi-k2) and T1/ and (w_mxfp4/ or w_nvfp4/ or w_nvfp4_a_nvfp4/) and triton_bitplace"' \
  > $OUT/bench-t1.log 2>&1
echo "bench T1: rc=$? $(( $(date +%s) - t0 )) s"
mkdir -p $OUT/bench-t1 && cp bench/table.md bench/targets.md $OUT/bench-t1/ 2>/dev/null
grep -E "^\| (gpt-oss|kimi)" bench/table.md
bash results/gpu-issue25/run-9/run-9.sh
