"""Deliberately broken policies: the conformance suite and the engine must catch each one, clearly.

Not a test module (no ``test_`` prefix); imported by tests/test_broken_policies.py and usable
from the CLI as ``engine check --policy tests/broken_policies.py:StarvesTenant``.
"""

from __future__ import annotations

from kvsched.core.decisions import Outcome
from kvsched.core.hookspecs import hookimpl
from kvsched.policies.continuous import ContinuousBatching


class AdmitsRunning(ContinuousBatching):
    """Tries to admit a group that is already running (a group that is not waiting)."""

    name = "broken-admits-running"

    @hookimpl
    def select_batch(self, step):
        for group in step.running:
            step.admit(group)
        return super().select_batch(step)


class StarvesTenant(ContinuousBatching):
    """Claims starvation freedom but never admits tenant ``bob``."""

    name = "broken-starves-bob"
    claims = frozenset({"starvation-free"})

    def order_waiting(self, step):
        return [g for g in step.waiting if g.tenant != "bob"]


class Raises(ContinuousBatching):
    """Raises from ``select_batch`` as soon as three requests wait."""

    name = "broken-raises"

    @hookimpl
    def select_batch(self, step):
        if len(step.waiting) >= 3:
            raise RuntimeError("queue too long for this policy")
        return super().select_batch(step)


class RaisesClaimingStarvationFree(Raises):
    """Claims starvation freedom, and raises as soon as three requests wait (as under any overload)."""

    name = "broken-raises-claiming-starvation-free"
    claims = frozenset({"starvation-free"})


class ChunksByNaN(ContinuousBatching):
    """Admits every prompt in chunks of NaN tokens (a float where a count belongs)."""

    name = "broken-chunks-by-nan"

    @hookimpl
    def select_batch(self, step):
        step.advance_running()
        for group in step.waiting:
            step.admit(group, max_tokens=float("nan"))


class PreemptsMostUrgent(ContinuousBatching):
    """Claims priority-respecting preemption but evicts the most urgent running group."""

    name = "broken-preempts-most-urgent"
    claims = frozenset({"priority-preemption"})

    def pick_victim(self, step, candidates, requester):
        return min(candidates, key=lambda g: g.priority)


__all__ = [
    "AdmitsRunning",
    "StarvesTenant",
    "Raises",
    "RaisesClaimingStarvationFree",
    "ChunksByNaN",
    "PreemptsMostUrgent",
    "Outcome",
]
