"""What the step builder notes for the decision log (a mixin of ``StepState``): each check that turns a group away
(LATER, a spent budget) and each reason a policy gives for holding admission back (``hold_back``) appends one small
tuple (``core.decisions.Decision``) with the numbers compared to ``SchedulerOutput.decisions``; plain decodes note
nothing, so the hot path pays nothing. ``kvsched.metrics.decision_log`` makes the log of them, for every policy alike.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING

from kvsched.core.decisions import Decision, Held, Outcome, Refused, held_problem
from kvsched.errors import quote

if TYPE_CHECKING:
    from kvsched.core.sequence import SequenceGroup


class DecisionNotes:
    def hold_back(self, reason: str, numbers: dict[str, float]) -> None:
        problem = held_problem(reason, numbers)
        if problem is not None:
            self.refuse(f"hold_back: {problem}; got {quote(reason)} and {quote(numbers)}")
        numbers = MappingProxyType(dict(numbers))  # read-only: observers see it
        self.output.decisions.append(Held(Decision.HELD, None, reason, numbers))

    def _note(self, outcome: Outcome | None, note: tuple) -> Outcome | None:
        self.output.decisions.append(note)
        return outcome

    def _no_blocks(self, g: SequenceGroup, needed: int) -> Outcome:
        """LATER, noted with the blocks ``g`` needs and the free ones (of which the watermark stays free)."""
        return self._note(Outcome.LATER, Refused(Decision.NO_BLOCKS, g.request_id, needed, self.bm.gpu.num_free))

    def _no_tokens(self, g: SequenceGroup, needed: int, left: int) -> Outcome:
        return self._note(Outcome.BUDGET, Refused(Decision.TOKEN_BUDGET, g.request_id, needed, left))

    def _over_budget(self, g: SequenceGroup, tokens: int) -> bool:
        """True (and noted) when ``tokens`` more, or ``g``'s sequences, exceed what is left of the step's budgets."""
        left, seats = self.max_tokens - self.output.num_batched_tokens, self.max_seqs - self.num_running_seqs
        if tokens > left:
            self._no_tokens(g, tokens, left)
        elif g.max_running_seqs > seats:
            self._note(None, Refused(Decision.SEQ_BUDGET, g.request_id, g.max_running_seqs, seats))
        else:
            return False
        return True
