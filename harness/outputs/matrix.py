"""The nightly GPU CI matrix, generated from the platform data (harness.platforms.PLATFORMS): one leg
per GPU platform, on self-hosted runners carrying that platform's labels. `python -m harness matrix`
prints it as the JSON that .github/workflows/nightly.yml feeds to `strategy.matrix` (fromJSON)."""

from __future__ import annotations

import json
import os

from harness.platforms import PLATFORMS

__all__ = ["nightly_matrix", "shared_database", "HYPOTHESIS_DB_ARTIFACT"]

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


def shared_database(local):
    """The local database, plus - read-only - every nightly leg's uploaded database when
    MOE_CONFORMANCE_SHARED_DB=owner/repo is set (and GITHUB_TOKEN: Hypothesis's GitHubArtifactDatabase), or the
    database in a directory when it names one (a leg's artifact unpacked, or a copy from a GPU host): a failure
    the nightly GPU matrix found replays in the next local run."""
    repo = os.environ.get("MOE_CONFORMANCE_SHARED_DB")
    if not repo:
        return local
    from hypothesis.database import (DirectoryBasedExampleDatabase, GitHubArtifactDatabase, MultiplexedDatabase,
                                     ReadOnlyDatabase)

    if os.path.isdir(repo):  # a leg's database already downloaded and unpacked (or any local copy)
        return MultiplexedDatabase(local, ReadOnlyDatabase(DirectoryBasedExampleDatabase(repo)))
    if "/" not in repo or repo.count("/") != 1:
        raise ValueError(f"MOE_CONFORMANCE_SHARED_DB={repo!r}: expected owner/repo (the nightly legs' database "
                         "artifacts) or an existing directory (a database copied from one)")

    owner, _, name = repo.partition("/")
    shared = [ReadOnlyDatabase(GitHubArtifactDatabase(owner, name, artifact_name=leg["hypothesis-db"]))
              for leg in nightly_matrix()["include"]]
    return MultiplexedDatabase(local, *shared)
