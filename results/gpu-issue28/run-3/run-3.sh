#!/bin/bash
# Issue 28 run-3 (session 15, H200, carry .third_party): the one-token rows after the split-K epilogues were made
# to do the next step (GEMM2's: the top-k sum; GEMM1's of NVFP4 W4A4: the activation quantization), and their
# bit-for-bit tests compiled; then issue 24/25's run-9 (the two failures of nightly run-8, fixed); then memcheck.
export PYTHONUNBUFFERED=1
t0=$(date +%s)
timeout 90 python3 -m pytest -p no:cacheprovider -q suites/test_fp4_bits.py -k "next_step or k_tails" > $OUT/fold-test.log 2>&1
echo "fold tests: $(tail -1 $OUT/fold-test.log) $(( $(date +%s) - t0 )) s"
t0=$(date +%s)
timeout 150 make bench PY=python3 SETUP= BENCH_ARGS='-k "(gpt-oss-120b or kimi-k2) and T1/ and (w_mxfp4/ or w_nvfp4/ or w_nvfp4_a_nvfp4/) and triton_bitplace"' \
  > $OUT/bench-t1.log 2>&1
echo "bench T1: rc=$? $(( $(date +%s) - t0 )) s"
mkdir -p $OUT/bench-t1 && cp bench/table.md bench/targets.md $OUT/bench-t1/ 2>/dev/null
grep -E "^\| (gpt-oss|kimi)" bench/table.md
LIMIT9=${LIMIT9:-200} bash results/gpu-issue25/run-9/run-9.sh
timeout 90 compute-sanitizer --tool memcheck python3 tools/sanitize_kernels.py > $OUT/memcheck.log 2>&1
echo "memcheck: rc=$? $(grep -E 'ERROR SUMMARY' $OUT/memcheck.log)"
