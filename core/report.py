"""What ``on_step`` observers receive after each engine step."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from kvsched.core.outputs import StepFeatures
from kvsched.core.step_notes import repeated_notes

if TYPE_CHECKING:
    from kvsched.core.outputs import SchedulerOutput
    from kvsched.core.sequence import SequenceGroup
    from kvsched.core.view import CacheView, OutputView


class StepReport(NamedTuple):
    """One engine step, as ``on_step`` observers see it (immutable; built every step, so a named tuple)."""

    step: int  # 0-based step counter
    now: float  # engine clock after the step
    duration: float  # executor time of the step (simulated or measured)
    output: SchedulerOutput
    finished: tuple[SequenceGroup, ...]  # groups that ended in this step (including ignored ones)
    num_waiting: int
    num_running: int
    num_swapped: int
    cache: CacheView
    features: StepFeatures | None = None  # P, D, K and blocks moved, as of before the step applied
    started: float | None = None  # engine clock as the step was scheduled: requests that arrived by then were in its queues


class StepRun(NamedTuple):
    """Steps ``first`` .. ``first + len(duration) - 1``: a steady step repeated, advanced at once
    (docs/hooks.md "Steady runs"), as ``on_steps`` observers see them. Every step ran the batch of
    ``output`` (plain decodes of every running group); what changes from step to step is a tuple."""

    first: int  # the first step's counter
    output: OutputView  # the first step's
    started: tuple[float, ...]  # clock as each step was scheduled
    now: tuple[float, ...]  # clock after each step
    duration: tuple[float, ...]
    kv_tokens_read: tuple[int, ...]  # each step's K (its features: no prefill, D = len(output.scheduled), no block moved)
    num_waiting: tuple[int, ...]  # after each step (a group whose arrival the policy said changes nothing joins during a run)
    num_running: tuple[int, ...]  # after each step (the last may have finished groups)
    free_gpu_blocks: tuple[int, ...]  # after each step (blocks fall due as the sequences grow, and the last may free some)
    num_swapped: int
    finished: tuple[SequenceGroup, ...]  # groups (GroupViews) that ended in the last step
    cache: CacheView  # as of after the last step
    notes: tuple  # what decisions() needs: the steady step's notes, where the lane call came in them, each step's free blocks

    def features(self, i: int) -> StepFeatures:
        """Step ``first + i``'s features, as its report would have them."""
        return StepFeatures(0, self.output.decode_seqs, self.kv_tokens_read[i], 0, 0)

    def decisions(self, i: int) -> list[tuple]:
        """Step ``first + i``'s ``Decision`` notes (the refusals' free blocks as of that step)."""
        decisions, at, free = self.notes
        return repeated_notes(decisions, at, *free[i]) if decisions else []
