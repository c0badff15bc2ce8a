#!/bin/bash
# Issue 28 run-14, the bench (H200, carry .third_party; ~5.5 min): every issue-28 target from one make bench run with
# this commit's defaults (prefill's grouped tile order, NVFP4's exponent add on). The same filter as run-13.
export PYTHONUNBUFFERED=1
FILTER='(gpt-oss-120b or kimi-k2) and (T1/ or T8/ or T64/ or T8192/) and ((w_mxfp4/ or w_nvfp4/ or w_nvfp4_a_nvfp4/) and (triton_bitplace_gluon and not T8192/ or triton_bitplace and not triton_bitplace_gluon and T8192/) or bf16/ and (triton_emulation or torch_grouped_mm) or triton_kernels_ogs and not T8192/)'
t0=$(date +%s)
timeout 560 make bench PY=python3 SETUP= BENCH_ARGS="--durations=12 -k \"$FILTER\"" > $OUT/bench.log 2>&1
echo "bench: rc=$? $(( $(date +%s) - t0 )) s"; tail -1 $OUT/bench.log
cp bench/table.md bench/results.json bench/targets.md $OUT/ 2>/dev/null
grep -E "^\| " bench/targets.md | cut -c1-150
