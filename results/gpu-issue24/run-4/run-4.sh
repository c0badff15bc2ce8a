#!/bin/bash
# Session 12, H200 call 2 (carry .third_party): issue 24 Done-when 2 and 3.
# (A) `make conformance PY=python3 SETUP=` (ci profile): the conformance suites and, new, suites/test_model_shapes.py:
#     every GPU backend at each model's layer and TP share, 1/8/64 tokens, all experts allocated, the float64
#     reference on the GPU. pytest under `timeout --foreground -s INT` so that a cut run prints its summary.
# (B) tools/bound_growth.py --real-shares --device cuda: gpt-oss-120b TP2 and Kimi-K2 TP8, every expert, every
#     activation and structure: the catalog's FP8 bias mutant and its correct control.
export PYTHONUNBUFFERED=1
t0=$(date +%s)
make conformance PY=python3 SETUP= \
  PYTEST="timeout --foreground -s INT -k 20 330 python3 -m pytest -p no:cacheprovider" > $OUT/conformance.log 2>&1
echo "make rc=$? wall $(( $(date +%s) - t0 )) s" | tee -a $OUT/conformance.log
grep -E "^(FAILED|ERROR|XPASS)|passed|failed|slowest|^[0-9.]+s (call|setup)|KeyboardInterrupt" $OUT/conformance.log | tail -40
python3 - report/junit.xml > $OUT/model-shapes.md <<'PY'
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
grep -c "| pass |" $OUT/model-shapes.md; grep -c "| FAIL |" $OUT/model-shapes.md; grep "| FAIL |" $OUT/model-shapes.md | head
cp report/summary.md $OUT/ 2>/dev/null
t0=$(date +%s)
timeout -s INT 170 python3 tools/bound_growth.py --real-shares --device cuda --share gpt-oss-120b/2 --share kimi-k2/8 \
  > $OUT/real-shares-h200.md 2>&1
echo "bound_growth rc=$? wall $(( $(date +%s) - t0 )) s" | tee -a $OUT/real-shares-h200.md
tail -30 $OUT/real-shares-h200.md
