"""The vocabulary of decisions: what a step operation answered, and a preemption choice."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
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


@dataclass(frozen=True, slots=True)
class Preemption:
    """A policy's answer to ``choose_preemption``: evict ``victim``, by ``mode`` (None: the default rule)."""

    victim: GroupView
    mode: PreemptionMode | None = None


__all__ = ["Outcome", "Preemption", "PreemptionMode"]
