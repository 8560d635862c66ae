"""Hypothesis profiles: `dev` (default), `ci` (CI=true: derandomized) and `nightly` (long, random)."""

import os

from hypothesis import HealthCheck, settings

_common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("dev", max_examples=150, stateful_step_count=50, **_common)
settings.register_profile("ci", parent=settings.get_profile("ci"), max_examples=150, stateful_step_count=50, **_common)
settings.register_profile("nightly", derandomize=False, max_examples=1000, stateful_step_count=150, **_common)
settings.load_profile(os.getenv("HYPOTHESIS_PROFILE", "ci" if os.getenv("CI") else "dev"))
