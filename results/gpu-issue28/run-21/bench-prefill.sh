#!/bin/bash
# Issue 28 run-21 (session 23; H200, carry .third_party; ~2.5 min): make bench's MXFP4 prefill rows (8192 tokens,
# triton_bitplace) with the tail by the mean rows an expert (fit_tail_m: gpt-oss-120b 32, Kimi-K2 64).
export PYTHONUNBUFFERED=1
FILTER='(gpt-oss-120b or kimi-k2) and T8192/ and w_mxfp4/ and triton_bitplace and not triton_bitplace_gluon'
t0=$(date +%s)
timeout 140 make bench PY=python3 SETUP= BENCH_ARGS="--durations=4 -k \"$FILTER\"" > $OUT/bench.log 2>&1
echo "bench: rc=$? $(( $(date +%s) - t0 )) s"; tail -1 $OUT/bench.log
cp bench/table.md bench/results.json bench/targets.md $OUT/ 2>/dev/null
grep -E "prefill|T8192|8192" bench/targets.md bench/table.md | cut -c1-200
