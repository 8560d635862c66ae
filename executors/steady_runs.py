"""Steady runs: a repeated steady step advanced many times at once (docs/hooks.md "Steady runs").

The simulator's fast paths are the decode lane (``decode_lane.py``: plain decodes advanced together) and
this: while the scheduler may repeat the last step (``FastPath.repeat``) and nothing arrives, an engine's
steps differ only in what falls due (the lane's blocks), their duration, the clock and the counters, so a
run takes each at that cost, with no output, report or observer call, and tells an observer that asks
(``on_steps``) the whole run as one ``StepRun``. A single engine (``Engine.run``) and a fleet's replicas take runs
alike (``Engine.steady_run``); a run stopped by an arrival for another replica goes on coasting.
A step's duration is the executor's ``lane_seconds(n)(kv_tokens)``, a promise: what ``execute`` would charge it.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, NamedTuple

from kvsched.core.decisions import Decision, Refused
from kvsched.core.outputs import SchedulerOutput, StepFeatures
from kvsched.core.view import OutputView

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from kvsched.core.engine import Engine
    from kvsched.core.sequence import SequenceGroup
    from kvsched.core.view import CacheView
    from kvsched.executors.fast_path import FastPath


class StepRun(NamedTuple):
    """Steps ``first`` .. ``first + len(duration) - 1``: a steady step repeated, advanced at once
    (docs/hooks.md "Steady runs"), as ``on_steps`` observers see them. Every step ran the batch of
    ``output`` (plain decodes of every running group); what changes from step to step is a tuple."""

    first: int  # the first step's counter
    output: OutputView  # the first step's
    started: tuple[float, ...]  # clock as each step was scheduled
    now: tuple[float, ...]  # clock after each step
    duration: tuple[float, ...]
    kv_tokens_read: tuple[int, ...]  # each step's K (its features: no prefill, D = len(output.scheduled), no move)
    num_waiting: tuple[int, ...]  # after each step (an arrival that changes nothing for the policy joins during a run)
    num_running: tuple[int, ...]  # after each step (the last may have finished groups)
    free_gpu_blocks: tuple[int, ...]  # after each step (blocks fall due as the sequences grow; the last may free some)
    num_swapped: int
    finished: tuple[SequenceGroup, ...]  # groups (GroupViews) that ended in the last step
    cache: CacheView  # as of after the last step
    notes: RepeatedNotes  # what decisions() needs

    def features(self, i: int) -> StepFeatures:
        """Step ``first + i``'s features, as its report would have them."""
        return StepFeatures(0, self.output.decode_seqs, self.kv_tokens_read[i], 0, 0)

    def decisions(self, i: int) -> list[tuple]:
        """Step ``first + i``'s ``Decision`` notes (the refusals' free blocks as of that step)."""
        notes = self.notes
        if not notes.decisions:
            return []
        return repeated_notes(notes.decisions, notes.lane_at, notes.free_before[i], notes.free_after[i])


class RepeatedNotes(NamedTuple):
    """What ``StepRun.decisions`` rebuilds each step's notes from: the steady step's ``Decision`` notes, how many
    came before its lane call, and each step's free GPU blocks before and after its lane's due blocks (a refusal
    noted before the lane call saw the first, one noted after it the second)."""

    decisions: tuple
    lane_at: int
    free_before: tuple[int, ...]
    free_after: tuple[int, ...]


class Run(NamedTuple):
    """A steady run as it went: its steps' start times and durations, the free GPU blocks before and after each
    step, whether a group finished in its last step (then the next run starts with the scheduler's full check),
    whether an arrival stopped it, whether arrivals could join it, and the queues' lengths as it started (what its
    steps' reports show, but for the arrivals that joined). Two lists of free blocks, not one of pairs: a step
    appends to each, at no more cost than building a pair."""

    started: Sequence[float]
    durations: Sequence[float]
    free_before: Sequence[int]  # before each step's lane call (its due blocks)
    free_after: Sequence[int]  # after it, before the step's finished groups are freed
    finished: bool
    stopped: bool  # before an arrival it could not take in: it may go on coasting if nothing else is done to the engine
    joins: bool  # behind a refused head: it stands for steps a fleet's replica would take one at a time
    num_waiting: int
    num_running: int
    num_swapped: int


NO_RUN = Run((), (), (), (), False, False, False, 0, 0, 0)  # where no steady run may go


class SteadyRuns:
    """The steady runs of one engine (its ``FastPath.runs``, when its executor advances them)."""

    def __init__(self, engine: Engine, fast_path: FastPath) -> None:
        self.engine = engine
        self.fast_path = fast_path
        self._coasting: tuple[int, Callable[[int], float] | None] = (0, None)  # the run's batch size and its step cost

    def advance(self, until: float, join, limit: float, observe, fence: float, resume: bool) -> Run:
        """Repeat the steady step, no output, report or observer call, while it repeats unchanged: each step that
        starts before ``until`` (when a request arrives), up to ``limit`` steps (infinity: no limit) and the first that
        finishes a group; then tell ``observe`` (``on_steps``) the run. An arrival the policy said changes nothing
        joins the queue instead, when given ``join``, as the first step at or after it starts (``join(now)`` queues
        what arrived by ``now`` and returns the next arrival's time), unless that step starts at or after ``fence``
        (a fleet's next request not yet routed: the router must see the replica as it is then). ``resume``: the last
        run, stopped by an arrival and nothing done to the engine since, goes on coasting (its first step needs no
        full check)."""
        engine = self.engine
        sched, clock, executor, completion = engine.scheduler, engine.clock, engine.executor, engine.completion
        fast = self.fast_path
        lane, gpu, arrivals = fast.lane, sched.block_manager.gpu, fast.steady.arrivals
        audit = engine.config.audit_every_step
        started, durations, kv, waiting, free_before, free_after = [], [], [], [], [], []  # per step
        finished = []  # the groups that finished
        batch, (n, seconds) = None, (self._coasting if resume else (0, None))
        stopped = False  # by an arrival
        num_waiting, num_running, num_swapped = len(sched.waiting), len(sched.running), len(sched.swapped)
        limit = sys.maxsize if limit > sys.maxsize else limit  # infinity as an int: each step compares ints
        if resume and observe is not None:  # it may coast from its first step: the members as it goes on
            batch = lane.batch
        try:  # the steps taken count even if ``join`` (adding a request) or an audit raises partway
            while len(durations) < limit:  # a count: none at 0 or below
                now = clock.now()
                joining = until <= now
                if joining and (arrivals or join is None or fence <= now):  # the policy (or a router) decides again
                    stopped = True
                    break
                before, k = gpu.num_free, lane.kv_tokens  # what the members' next decodes read
                # No member finishing, nothing the repeat checks change (due blocks keep refusals refused): it coasts.
                coasting = n and lane.coast()
                if not coasting:
                    if not fast.repeat(None):
                        break
                    if n != lane.scheduled:  # the run's first step (later ones keep the batch)
                        n, seconds = lane.scheduled, executor.lane_seconds(lane.scheduled)
                    if batch is None and observe is not None:  # the members, before any leaves in the last step
                        batch = lane.batch
                if joining:  # the step is taken: what arrived by its start joins the queue
                    until = min(join(now), fence)
                duration = seconds(k)
                clock.advance(duration)
                started.append(now)
                durations.append(duration)
                if observe is not None:  # what only the observers' StepRun reads
                    kv.append(k)
                    waiting.append(len(sched.waiting))
                free_before.append(before)
                free_after.append(gpu.num_free)
                if not coasting and fast.apply(completion, clock.now(), finished):  # the groups it ended, retired
                    sched.remove_finished(finished)
                    engine.retire(finished)
                if audit:
                    engine.check()
                if finished:
                    break
        finally:
            engine.steps_ran(len(durations))
        self._coasting = (n, seconds)
        if durations and observe is not None:
            self._report(batch, started, durations, kv, waiting, free_before, free_after, finished, observe)
        # Run(...) without its __new__'s frame: a run is built after every step that ran the policy
        fields = (started, durations, free_before, free_after, bool(finished), stopped, not arrivals)
        return tuple.__new__(Run, (*fields, num_waiting, num_running, num_swapped))

    def _report(self, batch, started, durations, kv, waiting, free_before, free_after, finished, observe) -> None:
        """Tell the observers a steady run (``StepRun``), as ``Engine.complete`` tells them a step."""
        engine = self.engine
        sched, n, steps, steady = engine.scheduler, len(batch), len(durations), self.fast_path.steady
        out = SchedulerOutput(
            scheduled=batch, num_batched_tokens=n, decode_seqs=n, kv_tokens_read=kv[0], lane_decodes=n
        )
        # Tuples, not lists: what the observers share (the steady step's notes among them) is read-only.
        run = StepRun(
            engine.num_steps - steps,
            OutputView(out),
            tuple(started),
            (*started[1:], engine.clock.now()),
            tuple(durations),
            tuple(kv),
            tuple(waiting),
            (len(sched.running) + len(finished),) * (steps - 1) + (len(sched.running),),
            (*free_after[:-1], sched.block_manager.gpu.num_free),
            len(sched.swapped),
            tuple([g.view for g in finished]),
            sched.cache_view,
            RepeatedNotes(tuple(steady.notes), steady.notes_at, tuple(free_before), tuple(free_after)),
        )
        out.decisions = run.decisions(0)
        observe(run)


def repeated_notes(notes: list[tuple], at: int, free: int, after: int) -> list[tuple]:
    """A steady step's notes as its repeat takes them: a refusal's free blocks as of the repeat (``after``
    the lane's due blocks for those noted after the lane call, the ``at``-th note on)."""
    refused = Decision.NO_BLOCKS
    return [
        Refused(n.kind, n.request_id, n.needed, free if i < at else after) if n.kind is refused else n
        for i, n in enumerate(notes)
    ]
