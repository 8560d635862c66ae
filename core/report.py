"""What ``on_step`` observers receive after each engine step."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from kvsched.core.outputs import StepFeatures

if TYPE_CHECKING:
    from kvsched.core.outputs import SchedulerOutput
    from kvsched.core.sequence import SequenceGroup
    from kvsched.core.view import CacheView


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
    started: float | None = None  # engine clock as the step was scheduled (what had arrived was queued)
