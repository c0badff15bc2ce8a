#!/bin/bash
# Session 11, H200 call 3 (carry .third_party): the nightly workflow's second step alone (the harness's own suites),
# to name the failure run-3 cut short and time the step; the last device minutes of the session.
export PYTHONUNBUFFERED=1
t0=$(date +%s)
timeout 370 make conformance PY=python3 SETUP= PROFILE=nightly REPORT=report/harness \
  SUITES="suites --ignore=suites/bench --ignore=suites/test_conformance.py --ignore=suites/test_special_values.py --ignore=suites/test_parallel_conformance.py" \
  > $OUT/nightly-harness.log 2>&1
echo "make rc=$? wall $(( $(date +%s) - t0 )) s" | tee -a $OUT/nightly-harness.log
grep -E "^(FAILED|ERROR)|passed|failed|slowest|^[0-9.]+s (call|setup)|^E  " $OUT/nightly-harness.log | tail -60
cp report/harness/summary.md report/harness/junit.xml $OUT/ 2>/dev/null
