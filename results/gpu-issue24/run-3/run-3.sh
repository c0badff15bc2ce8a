#!/bin/bash
# Issue 24 run-3 on the H200 (carry .third_party): how the matrix unit rounds its accumulation (is the
# probabilistic GEMM term safe there?), then every suite but the benchmarks under the ci profile, verbose,
# to find the nightly leg's failures (results/gpu-issue25/run-1 was cut at 560 s with 3 F's).
export PYTHONUNBUFFERED=1
python3 tools/probe_mma_accumulation.py 2>&1 | tee $OUT/mma-accumulation.md
timeout 400 python3 -m pytest -p no:cacheprovider suites --ignore=suites/bench --hypothesis-profile=ci -n 16 -m sm90 \
  -rfE --tb=short --durations=40 2>&1 | tee $OUT/ci-sm90.log | grep -v "^\[gw\|^[.sxF]*\s*\[" | tail -150
