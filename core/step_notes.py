"""What the step builder notes for the decision log: why a group did not run, with the numbers compared.

Each check that turns a group away (LATER, a spent budget), and each reason a policy gives for
holding admission back (``hold_back``), appends one small tuple (``core.decisions.Decision``) to
the step's ``SchedulerOutput.decisions``. Plain decodes note nothing, so the hot path pays nothing;
``kvsched.metrics.decision_log`` turns the notes into the decision log, for every policy alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvsched.core.decisions import Decision, Outcome
from kvsched.core.errors import PolicyError

if TYPE_CHECKING:
    from kvsched.core.sequence import SequenceGroup


class DecisionNotes:
    """The part of ``StepBuilder`` that notes decisions (a mixin over its output, budgets and block manager)."""

    def hold_back(self, reason: str, **numbers: float) -> None:
        """Say why the policy offers no (more) waiting group in this step, with the numbers it compared,
        e.g. ``step.hold_back("delay gate", waited_s=0.8, limit_s=1.2)``: the decision log gives it as
        the reason for every waiting group the policy did not offer."""
        if not isinstance(reason, str):
            raise PolicyError(self.policy_name, f"hold_back: reason must be a str, got {type(reason).__name__}")
        self.output.decisions.append((Decision.HELD, None, reason, numbers))

    def _note(self, outcome: Outcome | None, *record) -> Outcome | None:
        self.output.decisions.append(record)
        return outcome

    def _no_blocks(self, g: SequenceGroup, needed: int) -> Outcome:
        """LATER, noted with the blocks ``g`` needs and the free ones (of which the watermark stays free)."""
        return self._note(Outcome.LATER, Decision.NO_BLOCKS, g.request_id, needed, self._bm.gpu.num_free)

    def _no_tokens(self, g: SequenceGroup, needed: int, left: int) -> Outcome:
        return self._note(Outcome.BUDGET, Decision.TOKEN_BUDGET, g.request_id, needed, left)

    def _over_budget(self, g: SequenceGroup, tokens: int) -> bool:
        """True (and noted) when ``tokens`` more, or ``g``'s sequences, exceed what is left of the step's budgets."""
        left, seats = self._max_tokens - self.output.num_batched_tokens, self._max_seqs - self.num_running_seqs
        if tokens > left:
            self._no_tokens(g, tokens, left)
        elif g.max_running_seqs > seats:
            self._note(None, Decision.SEQ_BUDGET, g.request_id, g.max_running_seqs, seats)
        else:
            return False
        return True
