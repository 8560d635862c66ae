"""``lcf``: least-computed-first preemption victims on vLLM V1 (RFC #54644, PR #53723)."""

from __future__ import annotations

import random

from kvsched.core.decisions import Preemption, PreemptionMode
from kvsched.core.hookspecs import hookimpl
from kvsched.policies.vllm_v1 import VllmV1

VICTIMS = ("lcf", "lifo", "mcf", "random")


class Lcf(VllmV1):
    """vLLM V1, but short of KV blocks the running request with the fewest computed tokens is preempted.

    A recompute preemption throws away the victim's computed tokens, so the victim with the least
    sunk compute wastes the least. As PR #53723 does, the requester is never its own victim while
    another running request exists, and the running queue is walked from its tail, so among equal
    counts the last admitted is taken. ``victim`` selects the RFC's ablation: ``lcf`` (default),
    ``lifo`` (V1's own tail), ``mcf`` (most computed first) or ``random`` (seeded by ``seed``).
    """

    name = "lcf"
    claims = frozenset({"starvation-free"})  # restated: V1's admission order is untouched, only the victim changes

    def __init__(self, victim: str = "lcf", seed: int = 0, **v1) -> None:
        super().__init__(**v1)
        if victim not in VICTIMS:
            raise ValueError(f"victim must be one of {', '.join(VICTIMS)}, got {victim!r}")
        self.victim = victim
        self.rng = random.Random(seed)

    def pick(self, candidates):
        if self.victim == "lifo":
            return candidates[0]
        if self.victim == "random":
            return self.rng.choice(candidates)
        computed = (lambda g: g.num_computed_tokens) if self.victim == "lcf" else (lambda g: -g.num_computed_tokens)
        return min(candidates, key=computed)  # the first minimum: the tail's end among equals

    @hookimpl
    def choose_preemption(self, step, requester):
        preempted = set(step.preempted)
        candidates = [g for g in reversed(step.running) if g is not requester and g not in preempted]
        victim = self.pick(candidates) if candidates else requester
        why = (
            f"{self.victim} victim: {victim.num_computed_tokens} computed tokens"
            if candidates
            else "no other running request"
        )
        return Preemption(victim, PreemptionMode.RECOMPUTE, why)
