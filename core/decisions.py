"""The vocabulary of decisions: what a step operation answered, a preemption choice, and why (the notes of the decision log)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import TYPE_CHECKING

from kvsched.core.config import PreemptionMode

if TYPE_CHECKING:
    from kvsched.core.view import GroupView


class Outcome(str, Enum):
    """What ``StepBuilder.admit/advance/swap_in`` did with a group."""

    SCHEDULED = "scheduled"  # it runs in this step
    LATER = "later"  # not enough free blocks now; it stays where it is
    NEVER = "never"  # it can never run: the core ends it FINISHED_IGNORED
    BUDGET = "budget"  # the step's token or sequence budget is spent
    PREEMPTED = "preempted"  # no room could be made: the group itself was preempted


class Decision(IntEnum):
    """What a step operation notes in ``SchedulerOutput.decisions``, with the numbers its check compared.

    One tuple per decision that is not a plain decode, ``(Decision, request_id, ...)``, appended as
    the operation decides, so that an observer can tell why a request waited without any policy
    writing a line (``kvsched.metrics.decision_log`` turns them into the decision log).
    """

    PREFILL = 0  # (PREFILL, rid, tokens computed now, prompt tokens left after them, tokens found cached)
    SWAPPED_IN = 1  # (SWAPPED_IN, rid, blocks moved back to the GPU)
    PREEMPTED = 2  # (PREEMPTED, rid, PreemptionMode, rid it made room for, or None when the policy preempted it)
    IGNORED = 3  # (IGNORED, rid, why it can never run)
    NO_BLOCKS = 4  # (NO_BLOCKS, rid, blocks needed, free GPU blocks): LATER (OK needs free - needed >= watermark)
    TOKEN_BUDGET = 5  # (TOKEN_BUDGET, rid, tokens needed, tokens left): BUDGET
    SEQ_BUDGET = 6  # (SEQ_BUDGET, rid, sequences needed, sequences left): BUDGET
    HELD = 7  # (HELD, None, the policy's reason, {name: number it compared}): ``StepBuilder.hold_back``


@dataclass(frozen=True, slots=True)
class Preemption:
    """A policy's answer to ``choose_preemption``: evict ``victim``, by ``mode`` (None: the default rule)."""

    victim: GroupView
    mode: PreemptionMode | None = None


__all__ = ["Decision", "Outcome", "Preemption", "PreemptionMode"]
