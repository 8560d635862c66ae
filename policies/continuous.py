"""Iteration-level (Orca-style) continuous batching, the skeleton several built-in policies share.

Subclasses change only *order*: which waiting group is admitted first (``order_waiting``) and
which running group gives up its blocks (``pick_victim``). The step itself is always the same,
so differences between those policies come from their ordering rule alone.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvsched.core.decisions import Outcome, Preemption
from kvsched.core.hookspecs import hookimpl
from kvsched.core.view import GroupView

STOP = (Outcome.LATER, Outcome.BUDGET)


def decode_then_resume(step) -> bool:
    """Advance every running group, then swap groups back in; True if prompts may be admitted.

    Prompts wait while the step had to preempt or a group is still swapped out, so that memory
    pressure is relieved before it is added to.
    """
    step.advance_running(stop_on_preempted=False)
    if step.num_preempted:
        return False
    for group in step.swapped:
        if step.swap_in(group) in STOP:
            break
    return all(step.was_touched(g) for g in step.swapped)


class ContinuousBatching:
    """Decode every running group, resume swapped ones, then admit prompts into what is left.

    New prompts join the running batch in the same step (mixed prefill + decode), with no delay
    gate. Nothing is admitted while a group is still swapped out or in a step that had to
    preempt, so memory pressure is relieved before it is added to.
    """

    name = "continuous"
    claims: frozenset[str] = frozenset()

    @property
    def fcfs(self) -> bool:
        """Waiting groups offered in queue order, as the skeleton does unless a subclass orders them its own way."""
        return type(self).order_waiting is ContinuousBatching.order_waiting

    def order_waiting(self, step) -> Iterable[GroupView]:
        """The order in which waiting groups are offered for admission (default: queue order)."""
        return step.waiting

    def pick_victim(self, step, candidates: list[GroupView], requester: GroupView) -> GroupView | None:
        """The running group to evict so that ``requester`` can decode; None for the core default."""
        return None

    @hookimpl
    def select_batch(self, step):
        if not decode_then_resume(step):
            return True
        for group in self.order_waiting(step):
            if not step.was_touched(group) and step.admit(group) in STOP:
                break
        return True

    @hookimpl
    def choose_preemption(self, step, requester):
        candidates = [g for g in step.running if g is not requester and not step.was_touched(g)]
        if not candidates:
            return None
        victim = self.pick_victim(step, candidates, requester)
        return None if victim is None else Preemption(victim)
