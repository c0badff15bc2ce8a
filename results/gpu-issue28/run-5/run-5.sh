#!/bin/bash
# Issue 28 run-5 (written in session 16 for the next loan, H200, carry .third_party), two calls:
#   PART=check bash results/gpu-issue28/run-5/run-5.sh   (~4 min; at most 560 s)
#   PART=bench bash results/gpu-issue28/run-5/run-5.sh   (~7 min)
# check: the defaults changed in session 16 without a GPU run of their own - rows stored in pairs, the decode row
# that splits K until GEMM1 has 512 programs, block factors built once as bf16x2 words as the only compiled path -
# through triton_bitplace's conformance, special values and FP4 bit tests on sm90 (the new test of the K loop's
# decoded tile, every code under every scale, both layouts, among them), and the routing launch that also
# quantizes GEMM1's NVFP4 W4A4 input (suites/test_triton_helpers.py, bit for bit nvfp4_quantize_kernel's; every
# NVFP4 W4A4 conformance case), triton_emulation's conformance (its compiled K loop now feeds bf16 activations and
# bf16 weights straight into the MMA), then memcheck and racecheck.
# bench: every target of issue 28 from one `make bench` run: the targets filter of BENCHMARKS.md with
# triton_kernels_ogs on gpt-oss-120b and kimi-k2-swigluoai (Kimi-K2's shape with the activation it fuses).
export PYTHONUNBUFFERED=1
HOST=$(python3 -m harness platforms --host)
if [ "${PART:-check}" = check ]; then
  timeout 270 python3 -m pytest -p no:cacheprovider -q -n 12 -m $HOST suites/test_conformance.py \
    suites/test_special_values.py suites/test_fp4_bits.py suites/test_triton_helpers.py \
    -k "(bitplace or triton_emulation or nvfp4_a_nvfp4) and not gluon and not hypothesis or kernel_decodes or block_order or fills_the_gpu or next_step or test_triton_helpers" \
    > $OUT/conformance.log 2>&1
  echo "conformance (row pairs, split_k_to_fill, factor words): $(tail -1 $OUT/conformance.log)"
  grep -E "^(FAILED|ERROR)" $OUT/conformance.log | head -20
  MOE_CONFORMANCE_BITPLACE_ROW_PAIRS=0 timeout 90 python3 -m pytest -p no:cacheprovider -q -n 8 -m $HOST \
    suites/test_conformance.py -k "bitplace and not hypothesis" > $OUT/conformance-rows.log 2>&1
  echo "conformance, rows one by one: $(tail -1 $OUT/conformance-rows.log)"
  for tool in memcheck racecheck; do
    timeout 100 compute-sanitizer --tool $tool python3 tools/sanitize_kernels.py > $OUT/$tool.log 2>&1
    echo "$tool: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/$tool.log | tail -1)"
  done
else
  t0=$(date +%s)
  timeout 570 make bench PY=python3 SETUP= BENCH_ARGS='--durations=12 -k "(gpt-oss-120b or kimi-k2) and (T1/ or T8/ or T64/ or T8192/) and ((w_mxfp4/ or w_nvfp4/ or w_nvfp4_a_nvfp4/) and triton_bitplace and not gluon or bf16/ and (triton_emulation or torch_grouped_mm) or (w_mxfp4/ or w_nvfp4/) and dequantize_all and (T8/ or T64/) or triton_kernels_ogs and not T8192/)"' \
    > $OUT/bench.log 2>&1
  echo "bench: rc=$? $(( $(date +%s) - t0 )) s"; tail -3 $OUT/bench.log
  mkdir -p $OUT/bench && cp bench/table.md bench/results.json bench/targets.md $OUT/bench/ 2>/dev/null
  grep -E "^\| " bench/targets.md | head -60
fi
