"""What happens when a policy fails inside vLLM: the step falls back, the cause is logged once and counted.

The counter is a Prometheus counter, ``kvsched:policy_fallback_steps_total{policy, cause}``. It is
incremented in vLLM's engine-core process; ``engine serve`` runs the server with
``PROMETHEUS_MULTIPROC_DIR`` set, so vLLM's ``/metrics`` collects it from there.
"""

from __future__ import annotations

import logging
import re

logger = logging.getLogger("kvsched.integrations.vllm")

_VARYING = re.compile(r"'[^']*'|\d+")  # request ids and numbers: the same mistake on another request is the same cause


def _counter():
    from prometheus_client import Counter

    return Counter("kvsched:policy_fallback_steps", "Steps whose decision fell back to vllm-v1 because the policy failed",
                   ["policy", "cause"])


class PolicyFaults:
    """Counts fallback steps per cause and logs each cause the first time it happens."""

    _COUNTER = None  # one per process: Prometheus refuses a second registration of the same name

    def __init__(self, policy: str) -> None:
        self.policy = policy
        self.counts: dict[str, int] = {}
        if PolicyFaults._COUNTER is None:
            PolicyFaults._COUNTER = _counter()

    def record(self, error: Exception) -> None:
        """One step fell back because of ``error`` (a ``PolicyError``)."""
        message = str(error)
        cause = _VARYING.sub("_", message)[:200]
        first = cause not in self.counts
        self.counts[cause] = self.counts.get(cause, 0) + 1
        raised = error.__cause__
        label = type(raised).__name__ if raised is not None else "invalid decision"  # few values: a label, not a message
        PolicyFaults._COUNTER.labels(policy=self.policy, cause=label).inc()
        if first:
            logger.error("kvsched: %s; this step and every step it fails again fall back to vllm-v1's decision "
                         "(counted in kvsched:policy_fallback_steps_total)", message)
