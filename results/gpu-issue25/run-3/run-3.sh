#!/bin/bash
# Session 11, H200 call 2 (carry .third_party): the nightly leg's one-command form, exactly as issue 25's Done-when
# names it, and beside it (one process, its own database directory) the GPU half of the database round trip:
# the nightly search of test_conformance_hypothesis finds examples/hypothesis_only_bug.py's lone 4-token chunk.
export PYTHONUNBUFFERED=1
HOST=$(python3 -m harness platforms --host)
rm -rf .hypothesis roundtrip-db
( MOE_CONFORMANCE_HYPOTHESIS_DB=$PWD/roundtrip-db timeout 240 python3 -m pytest -p no:cacheprovider -m $HOST \
    suites/test_conformance.py -q -rfE --backend examples.hypothesis_only_bug:make_backend \
    -k test_conformance_hypothesis --hypothesis-profile=nightly > $OUT/roundtrip-gpu.log 2>&1
  tar czf $OUT/roundtrip-db.tgz roundtrip-db ) &
t0=$(date +%s)
timeout 565 make conformance PY=python3 SETUP= PROFILE=nightly SUITES="suites --ignore=suites/bench" \
  > $OUT/nightly.log 2>&1
echo "make rc=$? wall $(( $(date +%s) - t0 )) s" | tee -a $OUT/nightly.log
grep -E "^(FAILED|ERROR)|passed|failed|slowest|^[0-9.]+s (call|setup)" $OUT/nightly.log | tail -45
wait
grep -E "tokens=|passed|failed" $OUT/roundtrip-gpu.log | head -5
cp report/summary.md report/junit.xml $OUT/ 2>/dev/null
