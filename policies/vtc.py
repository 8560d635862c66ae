"""``vtc``: fair sharing across tenants with the Virtual Token Counter (Sheng et al., OSDI'24)."""

from __future__ import annotations

from collections import defaultdict, deque

from kvsched.core.decisions import Outcome
from kvsched.core.hookspecs import hookimpl
from kvsched.policies.continuous import STOP, decode_then_resume


class Vtc:
    """Virtual Token Counter: admit from the backlogged tenant that has received the least service.

    Each tenant has a counter of weighted service: ``input_weight`` per prompt token when a
    request is admitted, ``output_weight`` per generated token (the VTC artifact's prices are 1
    and 2). Admission repeatedly takes the head (FCFS within a tenant) of the backlogged tenant
    with the smallest counter. A tenant that becomes backlogged is lifted to the smallest
    counter among the other backlogged tenants (or to the last served tenant's counter when
    none is backlogged), so idling never banks credit. Running groups always decode (the
    policy is work-conserving); swapped groups resume before new prompts.
    """

    name = "vtc"
    claims = frozenset({"starvation-free"})

    def __init__(self, input_weight: float = 1.0, output_weight: float = 2.0) -> None:
        self.input_weight, self.output_weight = input_weight, output_weight
        if self.input_weight < 0 or self.output_weight < 0:
            raise ValueError("token weights must be >= 0")
        self.counters: dict[str, float] = defaultdict(float)
        self._backlogged: set[str] = set()
        self._last_served: str | None = None

    def _lift(self, queues: dict[str, deque]) -> None:
        now_backlogged = set(queues)
        for tenant in now_backlogged - self._backlogged:
            others = [self.counters[t] for t in self._backlogged & now_backlogged]
            if others:
                floor = min(others)
            elif self._last_served is not None:
                floor = self.counters[self._last_served]
            else:
                floor = 0.0
            self.counters[tenant] = max(self.counters[tenant], floor)
        self._backlogged = now_backlogged

    @hookimpl
    def select_batch(self, step):
        may_admit = decode_then_resume(step)
        queues: dict[str, deque] = defaultdict(deque)
        for group in step.waiting:
            queues[group.tenant].append(group)
        self._lift(queues)
        if not may_admit:
            return True
        while queues:
            tenant = min(queues, key=lambda t: (self.counters[t], queues[t][0].arrival_time))
            group = queues[tenant].popleft()
            if not queues[tenant]:
                del queues[tenant]
            outcome = step.admit(group)
            if outcome is Outcome.SCHEDULED:
                self.counters[tenant] += self.input_weight * group.prompt_len
                self._last_served = tenant
            elif outcome in STOP:
                break
        return True

    @hookimpl
    def on_step(self, report):
        for scheduled in report.output.scheduled:
            if not scheduled.is_prefill:
                self.counters[scheduled.group.request.tenant] += self.output_weight * scheduled.num_tokens
