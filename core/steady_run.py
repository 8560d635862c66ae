"""Steady runs: the engine advancing a repeated steady step many times at once (docs/hooks.md "Steady runs"),
each step at the cost of what changes in it (the lane's due blocks, the clock, the counters), and
telling an observer that asks (``on_steps``) the whole run as one ``StepRun``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvsched.core.outputs import SchedulerOutput
from kvsched.core.report import StepRun
from kvsched.core.view import OutputView

if TYPE_CHECKING:
    from kvsched.core.request import Request


class SteadyRuns:
    """The part of ``Engine`` that advances steady runs (a mixin: it works on the engine's own state)."""

    def _steady_run(self, upcoming: Request | None, source, limit: int, observe, resume: bool = False) -> tuple[Request | None, int, bool]:
        """Repeat the steady step while it repeats unchanged, up to ``limit`` steps (-1: no limit) and one that
        finishes a group, with no output, report or observer call; then tell ``observe`` (``on_steps``) the
        run. Returns the next request to arrive, the steps taken, whether a group finished (a run may follow).
        ``resume``: the last run, stopped by an arrival and nothing done to the engine since, goes on coasting.
        ``last_run`` keeps the run's step start times, durations and free blocks (before, after) of each step."""
        sched, clock, seconds, arrivals = self.scheduler, self.clock, None, self.scheduler._steady[0]
        lane, gpu, audit = sched.lane, sched.block_manager.gpu, self.config.audit_every_step
        started, durations, kv, waiting, free, finished = [], [], [], [], [], []  # per step; the groups that finished
        batch, (n, seconds) = None, (self._coasting if resume else (0, None))
        while len(durations) != limit:
            now = clock.now()
            if upcoming is not None and upcoming.arrival_time <= now:
                if arrivals:  # the policy decides again
                    break
                upcoming = self._arrive(upcoming, source, now)
            before, k = gpu.num_free, lane.kv_tokens
            # No member finishing, nothing the repeat checks changes (due blocks keep every refusal refused): the lane coasts.
            coasting = n and lane.coast()
            if not coasting:
                if not sched.repeat_into(None):
                    break
                if n != lane.scheduled:  # the run's first step (later ones keep the batch)
                    n, seconds = lane.scheduled, self.executor.lane_seconds(lane.scheduled)
                if batch is None and observe is not None:  # the members, before any leaves in the last step
                    batch = lane.batch
            duration = seconds(k)
            clock.advance(duration)
            started.append(now)
            durations.append(duration)
            kv.append(k)
            waiting.append(len(sched.waiting))
            free.append((before, gpu.num_free))
            self.num_steps += 1
            if not coasting and self._apply_lane(clock.now(), finished):
                sched.remove_finished(finished)
                self._retire(finished)
            if audit:
                self.check()
            if finished:
                break
        self._coasting, self.last_run = (n, seconds), (started, durations, free)
        if durations and observe is not None:
            self._report_run(batch, started, durations, kv, waiting, free, finished, observe)
        return upcoming, len(durations), bool(finished)

    def _report_run(self, batch, started, durations, kv, waiting, free, finished, observe) -> None:
        """Tell the observers a steady run (``StepRun``), as ``complete`` tells them a step."""
        sched, n, steps = self.scheduler, len(batch), len(durations)
        out = SchedulerOutput(scheduled=batch, num_batched_tokens=n, decode_seqs=n, kv_tokens_read=kv[0], lane_decodes=n)
        # Tuples, not lists: what the observers share (the steady step's notes among them) is read-only.
        run = StepRun(self.num_steps - steps, OutputView(out), tuple(started), (*started[1:], self.clock.now()), tuple(durations),
                      tuple(kv), tuple(waiting), (len(sched.running) + len(finished),) * (steps - 1) + (len(sched.running),),
                      (*[after for _, after in free[:-1]], sched.block_manager.gpu.num_free), len(sched.swapped),
                      tuple([g.view for g in finished]), sched.cache_view, (tuple(sched._steady[4]), sched._steady[2][2], tuple(free)))
        out.decisions = run.decisions(0)
        observe(run)
