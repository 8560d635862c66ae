"""The step builder: what ``select_batch`` receives, and the only way a policy changes anything. It shows its
state as a view does (``core/view.py``); the rules live in ``core/step_state.py``."""

from __future__ import annotations

from functools import partial
from types import NoneType
from typing import TYPE_CHECKING

from kvsched.core.view import GROUPS, SHOWN, QueueView, show

if TYPE_CHECKING:
    from kvsched.core.config import EngineConfig, PreemptionMode
    from kvsched.core.decisions import Outcome
    from kvsched.core.step_state import StepState
    from kvsched.core.view import CacheView, GroupView


def _queue(name: str, step: StepBuilder) -> QueueView:
    """One of the scheduler's queues, shown until the step closes (an empty one: no queue, shown always)."""
    return QueueView(q, st.handed) if (q := getattr((st := SHOWN[step.__weakref__]).sched, name)) else _NO_GROUPS


_NO_GROUPS = QueueView([])  # what an empty queue shows: the step's queues change only as it commits


class StepBuilder:
    """One step under construction: read-only queues and budgets plus validated operations, valid only inside the
    ``select_batch`` call it was given to (its own ``__weakref__`` slot: its reads find it a class nearer)."""

    __slots__ = ("__weakref__",)
    __init__ = show  # StepBuilder(state): it shows the step's state while it lives (as a Window does)

    # ------------------------------------------------------------------ what a policy reads
    waiting = property(partial(_queue, "waiting"), doc="waiting groups at the start of the step, front first")
    running = property(partial(_queue, "running"), doc="running groups, oldest first")
    swapped = property(partial(_queue, "swapped"), doc="swapped groups, oldest first")
    now: float = property(lambda self: SHOWN[self.__weakref__].now, doc="the engine clock")
    config: EngineConfig = property(
        lambda self: SHOWN[self.__weakref__].sched.config_view, doc="the engine config (a read-only copy, ``frozen``)"
    )
    cache: CacheView = property(lambda self: SHOWN[self.__weakref__].sched.cache_view)
    num_batched_tokens = property(lambda self: SHOWN[self.__weakref__].output.num_batched_tokens)
    remaining_tokens = property(lambda self: (st := SHOWN[self.__weakref__]).max_tokens - st.output.num_batched_tokens)
    remaining_seqs = property(lambda self: (st := SHOWN[self.__weakref__]).max_seqs - st.num_running_seqs)
    num_preempted = property(lambda self: len(SHOWN[self.__weakref__].output.preempted))
    admitted = property(lambda self: tuple([g.view for g in SHOWN[self.__weakref__].admitted]), doc="admitted so far")
    preempted = property(lambda self: tuple([v.group.view for v in SHOWN[self.__weakref__].output.preempted]))
    scheduled = property(lambda self: tuple([s.group.view for s in SHOWN[self.__weakref__].output.scheduled]))

    def was_touched(self, group: GroupView) -> bool:
        """True once ``group`` was scheduled, preempted or ignored in this step."""
        return GROUPS.get(group, NoneType)() in SHOWN[self.__weakref__].touched  # group_of(group), inlined

    def newest_unscheduled(self, exclude: GroupView | None = None) -> GroupView | None:
        """The newest running group not yet touched in this step (vLLM's ``running.pop()``)."""
        return SHOWN[self.__weakref__].newest_unscheduled(exclude)

    # ------------------------------------------------------------------- what a policy does
    def admit(self, group: GroupView, max_tokens: int | None = None) -> Outcome:
        """Prefill a waiting group (its first ``max_tokens`` prompt tokens when chunking)."""
        return _live(self, "admit").admit(group, max_tokens)

    def advance(self, group: GroupView, max_tokens: int | None = None) -> Outcome:
        """Run a running group: one decode token per sequence, or the next chunk of its prefill."""
        return _live(self, "advance").advance(group, max_tokens)

    def swap_in(self, group: GroupView, max_tokens: int | None = None) -> Outcome:
        """Bring a swapped group back to the GPU and run it (a chunked prefill goes on with ``max_tokens`` at most)."""
        return _live(self, "swap_in").swap_in(group, max_tokens)

    def preempt(self, group: GroupView, mode: PreemptionMode | None = None) -> PreemptionMode:
        """Evict a running group now; returns the mode actually used."""
        return _live(self, "preempt").preempt(group, mode)

    def reorder_waiting(self, front: list[GroupView]) -> None:
        """Put the first ``len(front)`` waiting groups in ``front``'s order, now and after, before any admission."""
        _live(self, "reorder_waiting").reorder_waiting(front)

    def hold_back(self, reason: str, **numbers: float) -> None:
        """Say why the policy offers no (more) waiting group in this step, for the decision log, with the numbers it
        compared: ``step.hold_back("delay gate", waited_s=0.8, limit_s=1.2)``."""
        _live(self, "hold_back").hold_back(reason, numbers)

    def advance_running(self, stop_on_preempted: bool = True) -> Outcome:
        """``advance`` every untouched running group, oldest first; stop at BUDGET or (if ``stop_on_preempted``) at
        the first group itself preempted."""
        return _live(self, "advance_running").advance_running(stop_on_preempted)

    def advance_decodes(self, max_tokens: int | None = None) -> Outcome:
        """``advance`` every untouched decoding group, oldest first, passing over prefills (Sarathi-Serve);
        stops at BUDGET, of the step or of ``max_tokens`` (this call's cap; 0 or less: nothing fits)."""
        return _live(self, "advance_decodes").advance_decodes(max_tokens)


def _live(step: StepBuilder, op: str) -> StepState:
    """The step's state, if ``op`` may run now: inside the ``select_batch`` call of this very step."""
    st = SHOWN[step.__weakref__]
    running = st.hooks.in_hook
    if st.open and running == "select_batch":
        return st
    if not st.open:
        raise st.hooks.refuse(
            f"{op} on a step that is over (t={st.now:.6g}): a StepBuilder works only "
            "during the select_batch call it was given to"
        )
    where = f"inside {running}" if running else "outside any hook"
    raise st.hooks.refuse(f"{op} called {where}: the step's operations may be called only from select_batch")
