#!/bin/bash
# Issue 28 run-25 (staged in session 26; H200, carry .third_party). PART may name several parts.
#   PART=timing ~2 min: timing_methods.py on gpt-oss-120b bf16 / MXFP4 and Kimi-K2 bf16 at 8192 tokens: make bench's
#               median_ms against chain_timeline's pattern, pytest-benchmark's and the profiler's wall, with clocks
#   PART=bench  ~4 min: make bench's 8192-token rows (bf16, MXFP4, NVFP4, W4A4; both models) at this tree
#   PART=epilogue ~4 min: MOE_CONFORMANCE_EPILOGUE_FIT_PAIRS 0 / 1 (splitk_epilogue_kernel's programs 16 pairs tall, or
#               as tall as the call's pairs): gpt-oss-120b's one-token chain on a time line (MXFP4, W4A4) and make
#               bench's one-token gluon rows (both models, MXFP4, NVFP4, W4A4)
export PYTHONUNBUFFERED=1
here=$(dirname "$0")
for part in ${PART:-timing}; do
case $part in
  timing)
    for c in "gpt-oss-120b bf16 triton_emulation" "gpt-oss-120b w_mxfp4 triton_bitplace" "kimi-k2 bf16 triton_emulation"; do
      set -- $c
      timeout 150 python3 $here/timing_methods.py --model $1 --scheme $2 --backend $3 2>&1 | grep -v Warn
    done | tee $OUT/timing.log ;;
  bench)  # run-24's 8192-token rows, at this tree
    PART=bench bash $here/../run-24/run-24.sh ;;
  epilogue)
    for fit in 0 1; do
      MOE_CONFORMANCE_EPILOGUE_FIT_PAIRS=$fit timeout 100 python3 tools/chain_timeline.py --model gpt-oss-120b \
        --tokens 1 --backend triton_bitplace_gluon --scheme w_mxfp4 --scheme w_nvfp4_a_nvfp4 2>&1 | grep -v Warn \
        > $OUT/timeline-fit-$fit.log
      echo "epilogue programs fitted to the pairs: $fit"; grep -E "median|epilogue|partials" $OUT/timeline-fit-$fit.log
      FILTER='(gpt-oss-120b or kimi-k2) and T1/ and (w_mxfp4/ or w_nvfp4/ or w_nvfp4_a_nvfp4/) and triton_bitplace_gluon'
      MOE_CONFORMANCE_EPILOGUE_FIT_PAIRS=$fit timeout 200 make bench PY=python3 SETUP= BENCH_ARGS="-k \"$FILTER\"" \
        > $OUT/bench-fit-$fit.log 2>&1
      echo "bench: rc=$? $(tail -1 $OUT/bench-fit-$fit.log)"; cp bench/table.md $OUT/table-fit-$fit.md
      grep -E "T1 |\| 1 \|" $OUT/table-fit-$fit.md | cut -c1-160 | head -8
    done ;;
esac
done
