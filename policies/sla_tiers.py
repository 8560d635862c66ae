"""``sla-tiers``: interactive, batch and background tiers (vLLM RFC #30256, PRs #30293 / #30449)."""

from __future__ import annotations

from kvsched.core.decisions import Preemption, PreemptionMode
from kvsched.core.hookspecs import hookimpl
from kvsched.policies.vllm_v1 import VllmV1

TIERS = ("interactive", "batch", "background")


class SlaTiers(VllmV1):
    """vLLM V1 with requests ordered by SLA tier, then priority, then arrival; victims from the lowest tier.

    A request's tier is its ``slo_class`` when that names a tier, else ``batch`` (the RFC's default).
    Short of blocks, the running request of the least urgent tier (the latest among equals) is
    preempted, and never one of a more urgent tier than the requester's: then the requester itself
    gives way. ``max_interactive_batch_tokens`` (0: no cap) caps the prompt tokens interactive
    requests may take in one step, so a burst of them cannot shut the batch tier out.
    """

    name = "sla-tiers"
    claims = frozenset({"priority-preemption"})

    def __init__(self, max_interactive_batch_tokens: int = 0, **v1) -> None:
        super().__init__(**v1)
        self.cap = max_interactive_batch_tokens
        if self.cap < 0:
            raise ValueError(f"max_interactive_batch_tokens must be >= 0, got {max_interactive_batch_tokens}")

    @staticmethod
    def tier(group) -> int:
        return TIERS.index(group.slo_class) if group.slo_class in TIERS else 1

    def urgency(self, step, group) -> int:
        """Lower is more urgent (what the ``priority-preemption`` check compares)."""
        return self.tier(group)

    def order_waiting(self, step):
        taken = 0  # interactive prompt tokens admitted in this step
        for group in sorted(step.waiting, key=lambda g: (self.tier(g), g.priority, g.arrival_time)):
            interactive = self.tier(group) == 0
            if interactive and self.cap and taken >= self.cap:
                continue
            before = step.num_batched_tokens
            yield group
            if interactive:
                taken += step.num_batched_tokens - before

    @hookimpl
    def choose_preemption(self, step, requester):
        preempted = set(step.preempted)
        candidates = [g for g in step.running if g is not requester and g not in preempted]
        victim = max(candidates, key=lambda g: (self.tier(g), g.arrival_time), default=requester)
        if self.tier(victim) < self.tier(requester):
            victim = requester
        return Preemption(
            victim, PreemptionMode.RECOMPUTE, f"tier {TIERS[self.tier(victim)]}, the least urgent running"
        )
