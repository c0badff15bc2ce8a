#!/bin/bash
# Issue 28, H200 (carry .third_party), written in session 14 for the next loan: (1) the NVFP4 fold (E4M3 factor
# x 2^119, the 2^7 on the global scale) and MXFP4 against triton_kernels' GEMMs and the bf16 kernel, one bench
# run; (2) the same triton_bitplace rows with rows stored in pairs (MOE_CONFORMANCE_BITPLACE_ROW_PAIRS=1);
# (3) triton_bitplace's conformance on sm90 with both layouts, and the sanitizers of the folded NVFP4 path.
# Each bench row is checked against the reference at the model's H and I before it is timed.
export PYTHONUNBUFFERED=1
HOST=$(python3 -m harness platforms --host)
t0=$(date +%s)
timeout 260 make bench PY=python3 SETUP= BENCH_ARGS='--durations=5 -k "(gpt-oss-120b or kimi-k2) and (T1/ or T8/ or T64/) and ((w_mxfp4/ or w_nvfp4/ or w_nvfp4_a_nvfp4/) and triton_bitplace or bf16/ and triton_emulation or triton_kernels_ogs)"' \
  > $OUT/bench-default.log 2>&1
echo "bench default: rc=$? $(( $(date +%s) - t0 )) s"; tail -3 $OUT/bench-default.log
mkdir -p $OUT/bench-default && cp bench/table.md bench/results.json bench/targets.md $OUT/bench-default/ 2>/dev/null
t0=$(date +%s)
MOE_CONFORMANCE_BITPLACE_ROW_PAIRS=1 timeout 160 make bench PY=python3 SETUP= BENCH_ARGS='--durations=5 -k "(gpt-oss-120b or kimi-k2) and (T1/ or T8/ or T64/) and (w_mxfp4/ or w_nvfp4/ or w_nvfp4_a_nvfp4/) and triton_bitplace"' \
  > $OUT/bench-row-pairs.log 2>&1
echo "bench row pairs: rc=$? $(( $(date +%s) - t0 )) s"; tail -3 $OUT/bench-row-pairs.log
mkdir -p $OUT/bench-row-pairs && cp bench/table.md bench/results.json $OUT/bench-row-pairs/ 2>/dev/null
for rp in 0 1; do
  MOE_CONFORMANCE_BITPLACE_ROW_PAIRS=$rp timeout 100 python3 -m pytest -p no:cacheprovider -q -n 8 -m $HOST \
    suites/test_conformance.py suites/test_special_values.py suites/test_fp4_bits.py -k "bitplace and not hypothesis" \
    > $OUT/conformance-row-pairs-$rp.log 2>&1
  echo "conformance row_pairs=$rp: $(tail -1 $OUT/conformance-row-pairs-$rp.log)"
done
timeout 90 compute-sanitizer --tool memcheck python3 tools/sanitize_kernels.py > $OUT/memcheck.log 2>&1
echo "memcheck: rc=$? $(grep -E 'ERROR SUMMARY' $OUT/memcheck.log)"
