#!/bin/bash
# Session 13, H200 call 6: after true_divide (the reference's scales correctly rounded on the GPU too), checkpoints
# built on the GPU, at most 3 real-shape tests on the GPU at once and a case budget of 70% of its memory: the
# device tests of the reference, then `make conformance` with the real model shapes in its suite list (the
# proposed default), -rP (every verdict line with its seconds).
export PYTHONUNBUFFERED=1
t0=$(date +%s)
timeout 120 python3 -m pytest -p no:cacheprovider -q suites/test_formats_oracle.py -k "true_divide or built_on_the_gpu" > $OUT/device-tests.log 2>&1
tail -3 $OUT/device-tests.log
make conformance PY=python3 SETUP= REPORT=report/with-model-shapes \
  SUITES="suites/test_conformance.py suites/test_parallel_conformance.py suites/test_model_shapes.py" \
  PYTEST="timeout --foreground -s INT -k 20 450 python3 -m pytest -p no:cacheprovider -rP" > $OUT/conformance.log 2>&1
echo "make rc=$? wall $(( $(date +%s) - t0 )) s" | tee -a $OUT/conformance.log
grep -E "^(FAILED|ERROR|XPASS)|passed,|failed,|slowest|^[0-9.]+s (call|setup)|KeyboardInterrupt" $OUT/conformance.log | tail -30
grep -E "^(FAILED|xfailed) " $OUT/conformance.log | head -20
echo "verdict lines passed: $(grep -cE '^passed ' $OUT/conformance.log)"
python3 - report/with-model-shapes/junit.xml > $OUT/model-shapes.md <<'PY'
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
echo "model-shape verdicts: pass $(grep -c '| pass |' $OUT/model-shapes.md) FAIL $(grep -c '| FAIL |' $OUT/model-shapes.md) skipped $(grep -c '| skipped |' $OUT/model-shapes.md)"
cp report/with-model-shapes/summary.md $OUT/ 2>/dev/null
