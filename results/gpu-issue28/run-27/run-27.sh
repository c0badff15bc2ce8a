#!/bin/bash
# Issue 28 run-27 (staged in session 27; H200, carry .third_party). PART may name several parts.
#   PART=check  ~5 min: what the loan taken back in session 27 did not show for EPILOGUE_FIT_PAIRS (now the default):
#               run-26/fit_pairs_bits.py (the fitted epilogue against 16 pairs a program, compiled, 1-4 tokens), then
#               conformance and special values of triton_bitplace(_gluon) MXFP4 / NVFP4, memcheck over sanitize_kernels
#   PART=nvfp4  ~4 min: NVFP4 prefill at MXFP4's row (128 rows, tails of 32 or 64, inline) against its own 64-row
#               row, 8192 tokens, both models, W4A16 and W4A4, sustained (tune_moe, its default --warm-s 1)
#   PART=bench  ~4 min: make bench's 8192-token rows under the rule of session 27's review (the lower of cold and
#               sustained against the dense matmul read after each row), at this tree
export PYTHONUNBUFFERED=1
HOST=$(python3 -m harness platforms --host)
for part in ${PART:-check}; do
case $part in
  check)
    timeout 100 python3 results/gpu-issue28/run-26/fit_pairs_bits.py 2>&1 | grep -v -i warn > $OUT/fit_pairs_bits.log
    echo "fit_pairs_bits: rc=${PIPESTATUS[0]} $(tail -1 $OUT/fit_pairs_bits.log)"
    timeout 170 python3 -m pytest -p no:cacheprovider -q -n 8 -m $HOST suites/test_conformance.py \
      suites/test_special_values.py -k "triton_bitplace and (mxfp4 or nvfp4)" > $OUT/conformance.log 2>&1
    echo "conformance: rc=$? $(tail -1 $OUT/conformance.log)"; grep -E "^(FAILED|ERROR)" $OUT/conformance.log | head -5
    timeout 120 compute-sanitizer --tool memcheck python3 tools/sanitize_kernels.py > $OUT/memcheck.log 2>&1
    echo "memcheck: rc=$? $(grep -E 'ERROR SUMMARY' $OUT/memcheck.log | tail -1)" ;;
  nvfp4)
    cases=""
    for m in gpt-oss-120b kimi-k2; do for s in w_nvfp4 w_nvfp4_a_nvfp4; do cases="$cases --case $m/$s/triton_bitplace"; done; done
    OUT=$OUT timeout 330 python3 tools/tune_moe.py --tokens 8192 $cases --where block_m=64,128 --where block_n=64 \
      --where num_warps=4 --where num_stages=3 --where group_m=8 --where tma=0 --where persistent=0 \
      --where mma_steps=1 2>&1 | grep -v -i warn > $OUT/nvfp4-prefill.log
    echo "tune: rc=${PIPESTATUS[0]}"; grep -E "best|Error" $OUT/nvfp4-prefill.log ;;
  bench)
    PART=bench bash results/gpu-issue28/run-24/run-24.sh ;;
esac
done
