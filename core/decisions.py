"""The vocabulary of decisions (what a step operation answered, a preemption choice, why) and the step's notes of
them, of which ``kvsched.metrics.decision_log`` makes the log, for every policy alike."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntEnum
from types import MappingProxyType
from typing import TYPE_CHECKING, NamedTuple

from kvsched.core.config import PreemptionMode
from kvsched.errors import quote

if TYPE_CHECKING:
    from collections.abc import Mapping

    from kvsched.core.sequence import SequenceGroup
    from kvsched.core.view import GroupView


class Outcome(str, Enum):
    """What ``StepBuilder.admit/advance/swap_in`` did with a group."""

    SCHEDULED = "scheduled"  # it runs in this step
    LATER = "later"  # not enough free blocks now; it stays where it is
    NEVER = "never"  # it can never run: the core ends it FINISHED_IGNORED
    BUDGET = "budget"  # the step's token or sequence budget is spent
    PREEMPTED = "preempted"  # no room could be made: the group itself was preempted


class Decision(IntEnum):
    """The kind of each note in ``SchedulerOutput.decisions`` (its first field): one per decision that is not a plain
    decode, with the numbers compared, so that an observer can tell why a request waited without a policy's help."""

    PREFILL = 0
    SWAPPED_IN = 1
    PREEMPTED = 2
    IGNORED = 3
    NO_BLOCKS = 4
    TOKEN_BUDGET = 5
    SEQ_BUDGET = 6
    HELD = 7


class Prefill(NamedTuple):
    kind: Decision  # PREFILL
    request_id: str
    tokens: int  # computed now
    left: int  # prompt tokens left for later chunks
    cached: int  # found in the prefix cache at admission


class SwappedIn(NamedTuple):
    kind: Decision  # SWAPPED_IN
    request_id: str
    blocks: int  # moved back to the GPU


class Preempted(NamedTuple):
    kind: Decision  # PREEMPTED
    request_id: str
    mode: PreemptionMode
    requester: str | None  # the request it made room for; None when the policy preempted it
    reason: str | None  # the policy's, or None


class Ignored(NamedTuple):
    kind: Decision  # IGNORED
    request_id: str
    reason: str  # why it can never run


class Refused(NamedTuple):
    kind: Decision  # NO_BLOCKS: LATER (admission needs free - needed >= watermark); TOKEN_BUDGET, SEQ_BUDGET: BUDGET
    request_id: str
    needed: int  # blocks, tokens or sequences
    available: int  # free GPU blocks, or what is left of the step's budget


class Held(NamedTuple):
    kind: Decision  # HELD: the policy's own reason for offering no (more) waiting group (``hold_back``)
    request_id: None
    reason: str
    numbers: Mapping[str, float]  # read-only


MAX_REASON_CHARS = 200  # a ``hold_back`` reason at most: one cell of the decision log, written every step it holds
_INT64 = 1 << 63


def held_problem(reason: object, numbers: dict) -> str | None:
    """What keeps a ``hold_back`` reason and its numbers out of the decision log, or None: the policy is refused as it
    gives them, so that the log never fails on its values."""
    if type(reason) is not str:
        return "the reason must be a str"
    if len(reason) > MAX_REASON_CHARS:
        return f"the reason must be at most {MAX_REASON_CHARS} characters, got {len(reason):,}"
    for name, value in numbers.items():
        if type(value) is not float and type(value) is not int:
            return f"{quote(name)} must be an int or a float number"
        if type(value) is int and not -_INT64 <= value < _INT64:
            return f"{quote(name)} must be within the int64 range, or a float"
    if not (reason.isascii() and all(name.isascii() for name in numbers)):
        try:
            "".join((reason, *numbers)).encode()
        except UnicodeEncodeError:
            return "the reason and the names must be valid UTF-8 (no lone surrogate)"
    return None


@dataclass(frozen=True, slots=True)
class Preemption:
    """A policy's answer to ``choose_preemption``: evict ``victim`` by ``mode`` (None: the default) for ``reason``."""

    victim: GroupView
    mode: PreemptionMode | None = None
    reason: str | None = None


class DecisionNotes:
    """What a step notes (a mixin of ``StepState``): each check that turns a group away, each ``hold_back``."""

    def hold_back(self, reason: str, numbers: dict[str, float]) -> None:
        problem = held_problem(reason, numbers)
        if problem is not None:
            self.refuse(f"hold_back: {problem}; got {quote(reason)} and {quote(numbers)}")
        numbers = MappingProxyType(dict(numbers))  # read-only: observers see it
        self.output.decisions.append(Held(Decision.HELD, None, reason, numbers))

    def _no_blocks(self, g: SequenceGroup, needed: int) -> Outcome:
        """LATER, noted with the blocks ``g`` needs and the free ones (of which the watermark stays free)."""
        notes = (Decision.NO_BLOCKS, g.request_id, needed, self.bm.gpu.num_free)
        self.output.decisions.append(tuple.__new__(Refused, notes))  # Refused(*notes) without its __new__'s frame
        return Outcome.LATER

    def no_tokens(self, g: SequenceGroup, needed: int, left: int) -> Outcome:
        self.output.decisions.append(Refused(Decision.TOKEN_BUDGET, g.request_id, needed, left))
        return Outcome.BUDGET

    def _over_budget(self, g: SequenceGroup, tokens: int) -> bool:
        """True (and noted) when ``tokens`` more, or ``g``'s sequences, exceed what is left of the step's budgets."""
        left, seats = self.max_tokens - self.output.num_batched_tokens, self.max_seqs - self.num_running_seqs
        if tokens > left:
            self.no_tokens(g, tokens, left)
        elif g.max_running_seqs > seats:
            self.output.decisions.append(Refused(Decision.SEQ_BUDGET, g.request_id, g.max_running_seqs, seats))
        else:
            return False
        return True
