"""What happens when a policy, or kvsched's own code, fails inside a call from vLLM: contained, logged once, counted.

Nothing a policy does and nothing a client sends may stop vLLM's engine core. Two Prometheus counters:

- ``kvsched:policy_fallback_steps_total{policy, cause}``: steps whose decision fell back to
  ``vllm-v1`` because the policy raised or decided something invalid in ``select_batch``;
- ``kvsched:contained_faults_total{policy, where, cause}``: every other failure contained in a call
  from vLLM (``where``: ``add_request``: that request alone failed; ``on_step``: the step was applied,
  only the policy's report of it raised; ``schedule``, ``update_from_output``, ``finish``: the mirror
  was given up and vLLM's own scheduler decides from then on).

They are incremented in vLLM's engine-core process; ``engine serve`` runs the server with
``PROMETHEUS_MULTIPROC_DIR`` set, so vLLM's ``/metrics`` collects them from there.
"""

from __future__ import annotations

import logging
import re

from kvsched.errors import PolicyError

logger = logging.getLogger("kvsched.integrations.vllm")

_VARYING = re.compile(r"'[^']*'|\d+")  # request ids and numbers: the same mistake on another request is the same cause
FALLBACK = "this step and every step it fails again fall back to vllm-v1's decision"


def _counters():
    from prometheus_client import Counter

    return (
        Counter(
            "kvsched:policy_fallback_steps",
            "Steps whose decision fell back to vllm-v1 because the policy failed",
            ["policy", "cause"],
        ),
        Counter(
            "kvsched:contained_faults",
            "Failures of a policy or of kvsched inside a call from vLLM, contained",
            ["policy", "where", "cause"],
        ),
    )


class PolicyFaults:
    """Counts contained failures per cause and logs each cause the first time it happens."""

    _COUNTERS = None  # one pair per process: Prometheus refuses a second registration of the same name

    def __init__(self, policy: str) -> None:
        self.policy = policy
        self.counts: dict[str, int] = {}
        if PolicyFaults._COUNTERS is None:
            PolicyFaults._COUNTERS = _counters()

    def record(self, error: Exception, where: str = "select_batch", consequence: str = FALLBACK) -> None:
        """A call from vLLM failed because of ``error`` (a ``PolicyError`` from ``select_batch``: a fallback step)."""
        policy = isinstance(error, PolicyError)
        message = str(error) if policy else f"{where} failed: {type(error).__name__}: {error}"
        cause = _VARYING.sub("_", message)[:200]
        first = cause not in self.counts
        self.counts[cause] = self.counts.get(cause, 0) + 1
        raised = error.__cause__ if policy else error
        label = (
            type(raised).__name__ if raised is not None else "invalid decision"
        )  # few values: a label, not a message
        fallback, contained = PolicyFaults._COUNTERS
        if where == "select_batch":
            fallback.labels(policy=self.policy, cause=label).inc()
        else:
            contained.labels(policy=self.policy, where=where, cause=label).inc()
        if first:
            counter = "policy_fallback_steps" if where == "select_batch" else "contained_faults"
            logger.error(
                "kvsched: %s; %s (counted in kvsched:%s_total)",
                message,
                consequence,
                counter,
                exc_info=not policy and where != "add_request",
            )  # a bug of ours: its traceback
