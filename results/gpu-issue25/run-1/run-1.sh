#!/bin/bash
# Issue 25 run-1 on the H200 (carry .third_party): the nightly workflow's GPU leg, exactly as the workflow runs it.
export PYTHONUNBUFFERED=1
rm -rf .hypothesis
start=$(date +%s)
timeout 560 make conformance PY=python3 SETUP= PROFILE=nightly SUITES="suites --ignore=suites/bench" 2>&1 \
  | tee $OUT/nightly.log | tail -40
echo "wall: $(( $(date +%s) - start )) s" | tee -a $OUT/nightly.log
cp report/summary.md $OUT/nightly-summary.md 2>/dev/null
cp report/junit.xml $OUT/nightly-junit.xml 2>/dev/null
tar czf $OUT/hypothesis-db.tgz .hypothesis 2>/dev/null; du -sh .hypothesis
