"""Project-wide pytest configuration: Hypothesis profiles and the example database.

Profiles (pick with --hypothesis-profile NAME; `make test` uses ci):
  dev      quick local runs, random, database in .hypothesis/
  ci       derandomized and bounded so that `make test` fits CI's budget; no database writes
  nightly  many examples, database written (share .hypothesis/examples between runs, e.g. as a CI cache)
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

_DB = DirectoryBasedExampleDatabase(os.environ.get("MOE_CONFORMANCE_HYPOTHESIS_DB", ".hypothesis/examples"))
_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large]

settings.register_profile("dev", max_examples=50, deadline=None, database=_DB, suppress_health_check=_SLOW_OK)
settings.register_profile(
    "ci", max_examples=60, deadline=None, derandomize=True, database=None, print_blob=True,
    suppress_health_check=_SLOW_OK,
)
settings.register_profile(
    "nightly", max_examples=2000, deadline=None, database=_DB, print_blob=True, suppress_health_check=_SLOW_OK,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
