"""The core's fallback decisions, registered ``trylast`` under every policy: one that only builds batches still gets
vLLM's victim rule and watermark admission, and one that returns None from these hooks defers to them."""

from __future__ import annotations

from kvsched.core.decisions import Preemption
from kvsched.core.hookspecs import hookimpl


class CoreDefaults:
    """vLLM v0: preempt the newest running group (``running.pop()``), admit by the watermark rule."""

    @hookimpl(trylast=True)
    def choose_preemption(self, step, requester):
        victim = step.newest_unscheduled(exclude=requester)
        return Preemption(victim if victim is not None else requester)

    @hookimpl(trylast=True)
    def can_allocate(self, step, group):
        return step.cache.can_allocate(group)
