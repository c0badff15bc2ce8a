"""The real-model-shape verdicts of a run as a Markdown table, from its JUnit XML (suites/test_model_shapes.py
records each (share, tokens, backend) verdict as the test's `model_shape_runs` property).

    python3 tools/model_shape_table.py report/junit.xml > model-shapes.md

The last line counts the verdicts: pass, FAIL, skipped (each skip with its reason in the table).
"""
from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET


def main(junit: str) -> None:
    counts = {"pass": 0, "FAIL": 0, "skipped": 0}
    print("| test | share/tokens | backend | verdict | fraction of the bound / why not |\n|---|---|---|---|---|")
    for case in ET.parse(junit).iter("testcase"):
        for prop in case.iter("property"):
            if prop.get("name") != "model_shape_runs":
                continue
            for run in json.loads(prop.get("value")):
                verdict = "skipped" if run["ok"] is None else ("pass" if run["ok"] else "FAIL")
                counts[verdict] += 1
                detail = run["skipped"][:160] if run["ok"] is None else format(run["max_ratio"], ".3f")
                print(f"| {case.get('name')} | {run['case']} | {run['backend']} | {verdict} | {detail} |")
    print("\nmodel-shape verdicts: " + ", ".join(f"{k} {v}" for k, v in counts.items()))


if __name__ == "__main__":
    main(sys.argv[1])
