#!/bin/bash
# Session 14, H200 (carry .third_party): issue 25's Done-when command, the nightly leg in one command, now with the
# real model shapes in it (issue 24): make conformance PY=python3 SETUP= PROFILE=nightly SUITES="suites --ignore=suites/bench".
# A device call lasts at most 10 minutes and the command may take longer, so it is started detached (its log and
# a done-mark under /tmp/nightly-run6) and each call of this script waits for it up to 560 s, then returns what
# it has; a second call of the same script on the still-warm machine only waits and collects.
export PYTHONUNBUFFERED=1
RUN=${RUN:-/tmp/nightly-run6}  # run-7 and later: the same script, their own directory
mkdir -p $RUN
if [ ! -e $RUN/started ]; then
  rm -rf .hypothesis report
  date +%s > $RUN/started
  setsid nohup bash -c "make conformance PY=python3 SETUP= PROFILE=nightly SUITES='suites --ignore=suites/bench' \
      > $RUN/nightly.log 2>&1; echo \"make rc=\$?\" >> $RUN/nightly.log; date +%s > $RUN/done" > /dev/null 2>&1 < /dev/null &
  echo "started at $(date)"
else
  echo "already started $(( $(date +%s) - $(cat $RUN/started) )) s ago"
fi
t0=$(date +%s)
while [ ! -e $RUN/done ] && [ $(( $(date +%s) - t0 )) -lt 560 ]; do sleep 5; done
cp $RUN/nightly.log $OUT/
if [ -e $RUN/done ]; then
  echo "done: wall $(( $(cat $RUN/done) - $(cat $RUN/started) )) s"
  python3 tools/model_shape_table.py report/junit.xml > $OUT/model-shapes.md
  gzip -9c report/junit.xml > $OUT/junit.xml.gz; gzip -9c report/summary.md > $OUT/summary.md.gz
  tail -1 $OUT/model-shapes.md
  tar czf $OUT/hypothesis-db.tgz .hypothesis 2>/dev/null
else
  echo "still running: $(( $(date +%s) - $(cat $RUN/started) )) s since start"
fi
grep -E "^(FAILED|ERROR|XPASS)|passed|failed|make rc|^[0-9.]+s (call|setup)" $OUT/nightly.log | tail -40
tail -c 600 $OUT/nightly.log
