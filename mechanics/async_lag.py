"""The scheduler's own time and vLLM's async scheduling, as completion strategies (docs/simulation.md).

vLLM's ``AsyncScheduler`` builds step N+1 while step N runs, its CPU time hidden behind the model's, before N's tokens
are known: a request that N stops is still scheduled into N+1 (a wasted slot) and ends, on time, once N's output is
processed; a length cap is foreseen; a request arriving while N runs is first seen by N+2.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from kvsched.core.sequence import Sequence, SequenceGroup, SequenceStatus
from kvsched.mechanics.completion import Completion

if TYPE_CHECKING:
    from kvsched.core.engine import Engine
    from kvsched.core.executor import StepResult
    from kvsched.core.outputs import SchedulerOutput

# vLLM V1's schedule() + update_from_output() per step (benchmarks/scheduler_overhead.py, docs/performance.md):
# 0.16 ms + 0.0266 ms per request, the defaults of scheduler_ms and scheduler_request_ms with async scheduling.
VLLM_V1_SCHEDULER_MS, VLLM_V1_SCHEDULER_REQUEST_MS = 0.16, 0.0266


class SchedulerTime(Completion):
    """The scheduler's time in each step's: ``exec + sched``, or ``max(exec, sched)`` with async scheduling when the
    step before ran until this one was scheduled (its scheduling hid behind it). A step that runs nothing pays none."""

    timed = True

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        config = engine.config
        self.hidden = config.async_scheduling
        default = (VLLM_V1_SCHEDULER_MS, VLLM_V1_SCHEDULER_REQUEST_MS) if self.hidden else (0.0, 0.0)
        step_ms = default[0] if config.scheduler_ms is None else config.scheduler_ms
        request_ms = default[1] if config.scheduler_request_ms is None else config.scheduler_request_ms
        self.step_s, self.request_s = step_ms / 1000.0, request_ms / 1000.0
        self.busy_until: float | None = None  # when the last step that ran something ended

    def charge(self, output: SchedulerOutput, result: StepResult) -> None:
        if not output.is_empty:
            sched = self.step_s + self.request_s * len(output.scheduled)
            if self.hidden and self.busy_until == self.engine.scheduled_at:
                result.duration = max(result.duration, sched)
            else:
                result.duration += sched

    def ran(self, output: SchedulerOutput, now: float) -> None:
        self.busy_until = None if output.is_empty else now


class Stop(NamedTuple):
    """A sequence's stop token, seen a step late."""

    seq: Sequence
    at: float  # when the token came out: the sequence's finish time


class AsyncLag(SchedulerTime):
    """``SchedulerTime`` plus the one-step lag of step N's outputs (the module's docstring)."""

    lags = True

    def __init__(self, engine: Engine) -> None:
        if engine.config.num_speculative_tokens:
            raise ValueError("async_scheduling with num_speculative_tokens is not modelled")
        super().__init__(engine)
        self.pending: dict[int, Stop] = {}  # by seq id, the stops of this step
        self._due: dict[int, Stop] = {}  # the previous step's, resolved in this step
        self._ends: dict[SequenceGroup, float] = {}  # finish times, as their stops came out
        self.wasted_tokens = 0  # slots computed for a request that had already stopped
        self.stops_unscheduled = 0  # stops of requests the next step did not run (preempted, or left out)

    def apply(self, output, tokens, now: float) -> list[SequenceGroup]:
        """``Completion.apply``, then the stops of the step before that this one did not run (preempted or left out)."""
        self._due, self.pending, self._ends = self.pending, {}, {}
        finished = super().apply(output, tokens, now)
        sched = self.sched
        for seq, at in self._due.values():  # vLLM delivers an in-flight token to a preempted request too
            group = seq.group
            if seq.status.is_finished:  # aborted meanwhile
                continue
            self.stops_unscheduled += 1
            if group.num_unfinished_seqs == 1:
                sched.abort(group, at, SequenceStatus.FINISHED_STOPPED)
                finished.append(group)
            else:  # a forked group goes on without it
                super().stop_if_done(seq, seq.output[-1])
                if group.status is SequenceStatus.RUNNING:
                    sched.num_running_seqs -= 1
        for group in finished:  # before the engine reports them: a fanned-out parent ends with its last child
            at = self._ends.get(group)
            if at is not None:
                group.finish_time = at
        return finished

    def append(self, seq: Sequence, token: int, now: float) -> None:
        """A sequence that stopped in the step before ends here, its token dropped."""
        due = self._due.pop(seq.seq_id, None)
        if due is None:
            super().append(seq, token, now)
            return
        self.wasted_tokens += 1
        super().stop_if_done(seq, seq.output[-1])  # its stop token
        ends = self._ends
        ends[seq.group] = max(ends.get(seq.group, due.at), due.at)

    def stop_if_done(self, seq: Sequence, token: int) -> bool:
        """A stop token is seen a step late (the sequence stays scheduled); a length cap at once (vLLM foresees it)."""
        if token in seq.group.stop_tokens:
            self.pending[seq.seq_id] = Stop(seq, self.engine.clock.now())
            return False
        if super().stop_if_done(seq, token):
            self._ends[seq.group] = self.engine.clock.now()
            return True
        return False

    def seen_at(self, now: float) -> float:
        """While the last step ran, the next one was scheduled at its start."""
        return self.engine.scheduled_at if self.busy_until == now and self.engine.has_unfinished() else now
