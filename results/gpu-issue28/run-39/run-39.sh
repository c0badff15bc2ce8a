#!/bin/bash
# Issue 28 run-39 (session 43; an H200 or H100, carry .third_party). PART names the parts, in order:
#   PART=bench    ~5.5 min: every issue-28 target from one make bench run (run-35's bench part: BENCHMARKS.md;
#                 BENCH_TIMEOUT caps make bench, so that its files come back inside a short call)
#   PART=ncu      ~3 min: Nsight Compute on the prefill GEMMs at gpt-oss-120b's 8192 tokens (run-38/ncu.sh)
#   PART=entry    ~1 min: the quantizer entry points of the Triton backends, compiled (test_conformance's
#                 test_backend_quantizer_entry_points_are_bit_exact: nvfp4_quantize_kernel's codes path since
#                 session 42 runs its 16 x 16 tile as a 3-D reshape; the interpreter checked it, the GPU had not)
export PYTHONUNBUFFERED=1
HOST=$(python3 -m harness platforms --host)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
for part in ${PART:-bench ncu entry}; do
case $part in
  bench) PART=bench bash results/gpu-issue28/run-35/run-35.sh ;;
  ncu) timeout 250 bash results/gpu-issue28/run-38/ncu.sh ;;
  entry)
    mkdir -p $OUT/entry
    timeout 150 python3 -m pytest -p no:cacheprovider -q -n 4 -m $HOST suites/test_conformance.py \
      -k "quantizer_entry_points and triton" > $OUT/entry/entry.log 2>&1
    echo "entry: rc=$? $(tail -1 $OUT/entry/entry.log)"; grep -E "^(FAILED|ERROR)" $OUT/entry/entry.log | head -5 ;;
esac
done
