#!/bin/bash
# Issue 28 run-22 (session 24 wrote it; no device time was left to run it): H200, carry .third_party.
#   PART=probe  ~2-3 min: tma128_bisect.py (which dimension makes 128-row TMA activations wrong in the bit-placement loop)
#   PART=prefill ~2.5 min: run-21's MXFP4 prefill rows (fit_tail_m, never timed by make bench)
#   PART=bench  ~6 min: run-14's filter, every issue-28 target from one make bench run at this commit's defaults
export PYTHONUNBUFFERED=1
here=$(dirname "$0")
case "${PART:-probe}" in
  probe) timeout 400 python3 "$here/tma128_bisect.py" 2>&1 | grep -v Warning | tee $OUT/tma128_bisect.log ;;
  prefill) bash results/gpu-issue28/run-21/bench-prefill.sh ;;
  bench) bash results/gpu-issue28/run-14/bench.sh ;;
esac
