"""The vocabulary of decisions: what a step operation answered, a preemption choice, and why (the notes of the decision log)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import TYPE_CHECKING

from kvsched.core.config import PreemptionMode
from kvsched.core.errors import quote

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
    PREEMPTED = 2  # (PREEMPTED, rid, PreemptionMode, rid it made room for or None (the policy preempted it), its reason or None)
    IGNORED = 3  # (IGNORED, rid, why it can never run)
    NO_BLOCKS = 4  # (NO_BLOCKS, rid, blocks needed, free GPU blocks): LATER (OK needs free - needed >= watermark)
    TOKEN_BUDGET = 5  # (TOKEN_BUDGET, rid, tokens needed, tokens left): BUDGET
    SEQ_BUDGET = 6  # (SEQ_BUDGET, rid, sequences needed, sequences left): BUDGET
    HELD = 7  # (HELD, None, the policy's reason, {name: number it compared}): ``StepBuilder.hold_back``


MAX_REASON_CHARS = 200  # a ``hold_back`` reason at most: one cell of the decision log, written every step it holds
_INT64 = 1 << 63


def held_problem(reason: object, numbers: dict) -> str | None:
    """What keeps a ``hold_back`` reason and its numbers out of the decision log (None: nothing).

    The reason and each name must be a str that UTF-8 can carry (no lone surrogate), the reason at
    most ``MAX_REASON_CHARS`` long; each number an int of the log's int64 range or a float: so that
    the log never fails on a policy's values, the policy is refused as it gives them."""
    if type(reason) is not str:
        return "the reason must be a str"
    if len(reason) > MAX_REASON_CHARS:
        return f"the reason must be at most {MAX_REASON_CHARS} characters, got {len(reason):,}"
    for name, value in numbers.items():
        if type(value) is float:
            continue
        if type(value) is not int:
            return f"{quote(name)} must be an int or a float number"
        if not -_INT64 <= value < _INT64:
            return f"{quote(name)} must be within the int64 range, or a float"
    if not (reason.isascii() and all(name.isascii() for name in numbers)):
        try:
            reason.encode()
            "".join(numbers).encode()
        except UnicodeEncodeError:
            return "the reason and the names must be valid UTF-8 (no lone surrogate)"
    return None


@dataclass(frozen=True, slots=True)
class Preemption:
    """A policy's answer to ``choose_preemption``: evict ``victim``, by ``mode`` (None: the default rule), for ``reason``."""

    victim: GroupView
    mode: PreemptionMode | None = None
    reason: str | None = None


__all__ = ["Decision", "Outcome", "Preemption", "PreemptionMode", "held_problem"]
