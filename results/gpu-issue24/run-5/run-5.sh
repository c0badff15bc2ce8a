#!/bin/bash
# Session 12, H200 call 3 (carry .third_party): the real-model-shape suite alone (ci profile, 52 share x scheme tests),
# with GPU memory shared out in 4 GB slots weighted by each test's size (run-4 held 2 slots of 48 GB: three tests
# finished in 330 s). -rP prints every (share, tokens, scheme, backend) line with its seconds.
export PYTHONUNBUFFERED=1
t0=$(date +%s)
make conformance PY=python3 SETUP= SUITES="suites/test_model_shapes.py" REPORT=report/model-shapes \
  PYTEST="timeout --foreground -s INT -k 20 400 python3 -m pytest -p no:cacheprovider -rP" > $OUT/model-shapes.log 2>&1
echo "make rc=$? wall $(( $(date +%s) - t0 )) s" | tee -a $OUT/model-shapes.log
grep -E "^(FAILED|ERROR|XPASS)|passed,|failed,|slowest|^[0-9.]+s (call|setup)|KeyboardInterrupt" $OUT/model-shapes.log | tail -30
grep -E "^(passed|FAILED|xfailed) " $OUT/model-shapes.log | sort -t'(' -k2 -rn | head -5
python3 - report/model-shapes/junit.xml > $OUT/model-shapes.md <<'PY'
import json, sys, xml.etree.ElementTree as ET
print("| test | share/tokens | backend | verdict | fraction of the bound / why not |\n|---|---|---|---|---|")
for tc in ET.parse(sys.argv[1]).iter("testcase"):
    for p in tc.iter("property"):
        if p.get("name") == "model_shape_runs":
            for r in json.loads(p.get("value")):
                v = "skipped" if r["ok"] is None else ("pass" if r["ok"] else "FAIL")
                print(f"| {tc.get('name')} | {r['case']} | {r['backend']} | {v} | "
                      f"{r['skipped'][:160] if r['ok'] is None else format(r['max_ratio'], '.3f')} |")
PY
echo "pass $(grep -c '| pass |' $OUT/model-shapes.md) FAIL $(grep -c '| FAIL |' $OUT/model-shapes.md)"
grep "| FAIL |" $OUT/model-shapes.md | head
