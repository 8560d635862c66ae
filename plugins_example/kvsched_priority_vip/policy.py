"""The ``priority-vip`` policy: vLLM's default scheduler with every queue ordered by urgency instead of arrival."""

from __future__ import annotations

from kvsched import Outcome, Preemption, hookimpl

STOP = (Outcome.LATER, Outcome.BUDGET)


class PriorityVip:
    """Priority with a VIP tier: most urgent first, FCFS within a level, aging so that nobody starves.

    A request's level is its ``priority`` (lower is more urgent), ``vip_boost`` levels lower
    when its tenant is one of ``vip_tenants``. Waiting lowers it by one more level every
    ``aging_s`` seconds (``aging_s=0`` turns aging off), so a low-priority request eventually
    outranks fresh VIP arrivals. Prompts are admitted in urgency order behind vLLM's delay gate;
    running groups decode most urgent first; short of blocks, the least urgent running group
    (the newest among equals) is preempted, and never one more urgent than the requester.
    """

    name = "priority-vip"
    claims = frozenset({"starvation-free", "priority-preemption"})

    def __init__(self, vip_tenants: str = "vip", vip_boost: float = 4, aging_s: float = 2.0) -> None:
        self.vip_tenants = frozenset(t.strip() for t in str(vip_tenants).split(",") if t.strip())
        self.vip_boost = float(vip_boost)
        self.aging_s = float(aging_s)
        if self.vip_boost < 0 or self.aging_s < 0:
            raise ValueError("vip_boost and aging_s must be >= 0")
        self._last_prompt_time: float | None = None
        self._prompt_latency = 0.0

    def urgency(self, step, group) -> float:
        """Lower is more urgent: priority, minus the VIP boost, minus one level per ``aging_s`` waited."""
        level = group.priority - (self.vip_boost if group.tenant in self.vip_tenants else 0.0)
        if self.aging_s > 0:
            level -= (step.now - group.arrival_time) / self.aging_s
        return level

    def _ordered(self, step, groups):
        return sorted(groups, key=lambda g: (self.urgency(step, g), g.arrival_time))

    def _gate_open(self, step, waiting) -> bool:
        """vLLM's delay gate: the oldest waiting request waited > delay_factor × the last prompt step's latency."""
        if step.config.delay_factor <= 0 or not step.running:
            return True
        oldest = min(g.arrival_time for g in waiting)
        return step.now - oldest > step.config.delay_factor * self._prompt_latency

    @hookimpl
    def select_batch(self, step):
        if self._last_prompt_time is not None:  # the previous step was a prompt step: measure it
            self._prompt_latency, self._last_prompt_time = step.now - self._last_prompt_time, None
        waiting, swapped = self._ordered(step, step.waiting), self._ordered(step, step.swapped)
        swapped_first = swapped and (not waiting or self.urgency(step, swapped[0]) <= self.urgency(step, waiting[0]))
        if waiting and not swapped_first and self._gate_open(step, waiting):
            for group in waiting:
                if step.admit(group) in STOP:
                    break
            if step.admitted:  # as in vLLM, a step that admits prompts is prefill-only
                self._last_prompt_time = step.now
                return True
        for group in self._ordered(step, step.running):
            if not step.was_touched(group) and step.advance(group) is Outcome.BUDGET:
                break
        if not step.num_preempted:
            for group in swapped:
                if step.swap_in(group) in STOP:
                    break
        return True

    @hookimpl
    def choose_preemption(self, step, requester):
        candidates = [g for g in step.running if g is not requester and not step.was_touched(g)]
        if not candidates:
            return Preemption(requester)
        victim = max(candidates, key=lambda g: (self.urgency(step, g), g.arrival_time))
        if self.urgency(step, victim) < self.urgency(step, requester):
            return Preemption(requester)  # everyone left is more urgent: the requester yields
        return Preemption(victim)
