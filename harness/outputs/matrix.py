"""The nightly GPU CI matrix, generated from the platform data (harness.platforms.PLATFORMS): one leg
per GPU platform, on self-hosted runners carrying that platform's labels. `python -m harness matrix`
prints it as the JSON that .github/workflows/nightly.yml feeds to `strategy.matrix` (fromJSON)."""

from __future__ import annotations

import json

from harness.platforms import PLATFORMS

__all__ = ["nightly_matrix", "HYPOTHESIS_DB_ARTIFACT"]

# The nightly workflow uploads each leg's Hypothesis database under this name; conftest.py multiplexes
# them read-only into local runs (MOE_CONFORMANCE_SHARED_DB=owner/repo).
HYPOTHESIS_DB_ARTIFACT = "hypothesis-db-{platform}"


def nightly_matrix() -> dict:
    legs = []
    for p in PLATFORMS.values():
        if not p.is_gpu:
            continue  # the CPU platform is the PR workflow's (make test)
        legs.append({"platform": p.name, "runs-on": list(p.runner_labels), "vendor": p.vendor,
                     "fp8": p.fp8_format.name, "hypothesis-db": HYPOTHESIS_DB_ARTIFACT.format(platform=p.name)})
    return {"include": legs}


def nightly_matrix_json() -> str:
    return json.dumps(nightly_matrix(), separators=(",", ":"))
