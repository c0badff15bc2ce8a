#!/bin/bash
# Session 12, H200 call 1 (carry .third_party): issue 25's Done-when command, the nightly leg in one command, with
# the K-ordered bound and the declared matrix-unit truncation (first GPU run of both). pytest runs under
# `timeout --foreground -s INT` (PYTEST override) so that a cut run still prints -rfE and --durations.
export PYTHONUNBUFFERED=1
t0=$(date +%s)
make conformance PY=python3 SETUP= PROFILE=nightly SUITES="suites --ignore=suites/bench" \
  PYTEST="timeout --foreground -s INT -k 20 500 python3 -m pytest -p no:cacheprovider" > $OUT/nightly.log 2>&1
echo "make rc=$? wall $(( $(date +%s) - t0 )) s" | tee -a $OUT/nightly.log
grep -E "^(FAILED|ERROR|XPASS)|passed|failed|slowest|^[0-9.]+s (call|setup)|KeyboardInterrupt" $OUT/nightly.log | tail -60
cp report/summary.md report/junit.xml report/results.json $OUT/ 2>/dev/null
