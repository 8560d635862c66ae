"""The simulator's fast path for one engine: its decode lane, its steady steps and its steady runs.

An executor that knows its tokens before it runs (``KnownTokens``: the simulator) hands its engine one ``FastPath``,
the only door through which the core reaches any of this: the scheduler asks it to repeat the last step before
asking the policy (``replay``), tells it each step it commits (``record``) or rolls back, and each group it changes
on its own (``touch``: an abort, a preemption, a step's operation on it); the engine asks it for a steady run up to
the next arrival it may not take in (``advance``, through ``Engine.steady_run``: ``Engine.run`` after each step, a
fleet's replica before its next). The decode lane (``decode_lane.py``) advances plain decodes together, the step
builder and the completion step driving it; a steady step is one the scheduler may repeat without the policy
(docs/hooks.md "Steady steps"): a decode-lane step of every running group, for a policy that declared its order
first come, first served (``fcfs``), whose only note is the refusal of the waiting queue's head for want of blocks;
steady runs (``steady_runs.py``) advance such a step many times at once. Results are the same with every part of it
off. The core's counters stay the core's: the fast path changes them only through its calls (``Scheduler.seqs_ended``,
``Engine.steps_ran``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

from kvsched.core.decisions import Decision
from kvsched.core.outputs import SchedulerOutput
from kvsched.executors.decode_lane import DecodeLane
from kvsched.executors.steady_runs import NO_RUN, Run, SteadyRuns, repeated_notes
from kvsched.mechanics.completion import end_group

if TYPE_CHECKING:
    from collections.abc import Callable

    from kvsched.core.engine import Engine
    from kvsched.core.sequence import SequenceGroup
    from kvsched.core.step_state import StepState
    from kvsched.mechanics.completion import Completion


_NO_BLOCKS = Decision.NO_BLOCKS


@runtime_checkable
class KnownDurations(Protocol):
    """An executor that knows what a step of lane decodes costs without running it (the simulator's): the fast path
    advances the engine's steady runs, repeats taken at once (``steady_runs.py``; docs/hooks.md)."""

    def lane_seconds(self, num_seqs: int) -> Callable[[int], float]: ...


class Steady(NamedTuple):
    """The last step, when the scheduler may repeat it without the policy (``FastPath.repeat``; docs/hooks.md)."""

    arrivals: bool  # an arrival would change the policy's calls: nothing waited (else it joins behind the refused head)
    decodes_only: bool  # how the policy called the lane: advance_decodes, else advance_running
    cap: int | None  # advance_decodes' cap on the decodes' tokens
    notes_at: int  # notes taken before the lane call (a refusal noted after it saw the lane's due blocks taken)
    refusals: list[SequenceGroup]  # refused for want of blocks, each with the blocks it lacked (``refused``)
    notes: list[tuple]  # the step's decision notes
    num_waiting: int


class FastPath:
    """An engine's decode lane (``lane``), the steady step it may repeat (``steady``), and its steady runs."""

    def __init__(self, engine: Engine, tokens, steady_steps: bool) -> None:
        self.scheduler = sched = engine.scheduler
        self.lane = lane = DecodeLane(sched.block_manager, tokens)
        # What the step builder asks of the lane, its own method: take a step's advance_running or advance_decodes whole
        # if it is exact.
        self.take = lane.take
        self.repeats = steady_steps  # steady steps are repeated without the policy; same results either way
        self.steady: Steady | None = None  # the last step, if the scheduler may repeat it
        # Steady runs, when the executor can also advance them (unless an on_step plugin sees every step).
        runs = steady_steps and isinstance(engine.executor, KnownDurations) and not engine.hooks.observes_steps
        self.runs = SteadyRuns(engine, self) if runs else None

    @classmethod
    def of(cls, engine: Engine, tokens, steady_steps: bool) -> FastPath | None:
        """``engine``'s fast path, or None where the lane would not be exact: the lane takes v0's plain decodes
        (its block rule is v0's worst case), not with prefix caching (blocks hashed as they fill) nor timed steps."""
        config = engine.config
        if not (engine.mechanics.lane and config.decode_lane) or config.enable_prefix_caching:
            return None
        return None if engine.completion.timed else cls(engine, tokens, steady_steps)

    # ------------------------------------------------------------------------- the scheduler's calls
    def replay(self, policy: bool) -> SchedulerOutput | None:
        """The last, steady step scheduled again if the scheduler may (``policy``: it would call its own policy)
        and it is still valid; else None, and the scheduler asks the policy."""
        if self.steady is not None and policy:
            if self.repeat(out := SchedulerOutput()):
                return out
        self.steady = None
        return None

    def repeat(self, out: SchedulerOutput | None) -> bool:
        """Schedule the steady step again (into ``out``, or none: a steady run's step) if it is still valid: no
        arrival it depends on, each refusal still short of blocks, the decode lane still exact; False if not (given
        an output, a lane no longer exact is dissolved, as the policy's own call of the lane would)."""
        steady, sched = self.steady, self.scheduler
        if steady.arrivals and len(sched.waiting) != steady.num_waiting:  # an event for the policy
            return False
        bm = sched.block_manager
        free = bm.gpu.num_free
        for g in steady.refusals:
            if free - g.refused >= bm.watermark_blocks:
                return False
        budget = sched.config.max_num_batched_tokens
        if not self.lane.schedule(sched.running, out, budget, None, steady.decodes_only, steady.cap):
            if out is not None:
                self.lane.dissolve()
            return False
        if out is not None:  # the notes as of now: a refusal noted after the lane saw its due blocks taken
            out.lane_decodes = self.lane.scheduled
            out.decisions = repeated_notes(steady.notes, steady.notes_at, free, bm.gpu.num_free)
        return True

    def apply(self, completion: Completion, now: float, finished: list[SequenceGroup]) -> bool:
        """The lane's step ran to ``now`` (``completion`` applies the step): end the members that sampled their last
        token (into ``finished``); True if any."""
        ended = self.lane.apply()
        for seq in ended:
            if not completion.stop_if_done(seq, seq.output[-1]):  # the executor's first_stop and tokens_at disagree
                raise RuntimeError(f"the decode lane ended {seq!r}, but its tokens do not stop it")
            end_group(seq.group, now, finished)
            self.scheduler.seqs_ended(1)
        return bool(ended)

    def record(self, step: StepState, waiting: list[SequenceGroup]) -> None:
        """The policy's step was committed (``waiting``: the queue as it began): note it if it is steady."""
        if self.repeats and step.hooks.fcfs:
            self.steady = _steady(step, waiting, self.lane.call)

    def rollback(self) -> None:
        """The step failed: the lane as before it."""
        self.lane.rollback()

    def touch(self, group: SequenceGroup) -> None:
        """The core changes ``group`` on its own (a step's operation on it, its preemption, its abort): no step is
        steady any more (none is while a step is built), and the lane dissolves if ``group`` rides it (members change
        only together; a member is a group's only sequence)."""
        self.steady = None
        if group.seqs[0].lane is not None:
            self.lane.dissolve()

    def audit(self, running: list[SequenceGroup]) -> list[str]:
        """What is wrong with the lane's members against the running queue (``Scheduler.audit``)."""
        return self.lane.audit(running)

    # --------------------------------------------------------------------------- the engine's calls
    def advance(self, until: float, join, limit: float, observe, fence: float, resume: bool) -> Run:
        """A steady run (``SteadyRuns.advance``; ``Engine.steady_run``), where the last step may be repeated and runs
        are taken (else one of no step): the arrivals that change nothing for the policy join the queue through
        ``join``, the others end it, and so does ``fence`` (a fleet's next unrouted request)."""
        if self.runs is None or self.steady is None:
            return NO_RUN
        return self.runs.advance(until, join, limit, observe, fence, resume)


def _steady(step: StepState, waiting: list[SequenceGroup], lane_call: tuple[bool, int | None, int]) -> Steady | None:
    """``step`` as the scheduler may repeat it for a policy that declared ``fcfs``, or None: a decode-lane step of every
    running group (the lane's ``lane_call``) whose only note is the refusal of the head of ``waiting`` (as the step
    began) for want of blocks. A step that admitted or ignored a group, whose commit cut ``waiting`` in place, is
    none: its head is read only after those checks."""
    out, notes = step.output, step.output.decisions
    if not out.lane_decodes or out.lane_decodes != len(out.scheduled) or len(notes) > 1:
        return None
    if step.sched.swapped or out.preempted or out.ignored or out.blocks_to_swap_in or out.blocks_to_swap_out:
        return None
    refusals = waiting[:1] if notes else []
    if notes and not (refusals and notes[0].kind is _NO_BLOCKS and notes[0].request_id == refusals[0].request_id):
        return None
    if refusals and refusals[0].refused is None:
        return None
    return Steady(not refusals, *lane_call, refusals, notes, len(step.sched.waiting))
