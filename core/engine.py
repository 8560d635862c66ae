"""The engine: requests in, steps run, tokens out. The same loop drives the simulator and real models."""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import count
from types import MappingProxyType
from typing import Any

from kvsched.core.config import EngineConfig
from kvsched.core.executor import Clock, Executor, KnownTokens, StepResult
from kvsched.core.mechanics import Mechanics, installed
from kvsched.core.outputs import SchedulerOutput
from kvsched.core.plugins import PolicyHooks
from kvsched.core.report import StepReport
from kvsched.core.request import Request
from kvsched.core.scheduler import Scheduler
from kvsched.core.sequence import SequenceGroup, SequenceStatus
from kvsched.core.view import CacheView, GroupMap, OutputView, QueueView, let_go
from kvsched.errors import AuditError, StallError, quote

# A policy may wait, not forever: this many steps in a row that ran nothing, over this much time, is a stall.
STALL_STEPS, STALL_SECONDS = 1_000, 10.0


class Engine:
    """``add_request``, ``abort``, ``step`` and ``run``, over a scheduler and an executor. ``policy``: a name or a
    policy object; ``clock``: the executor's unless given; ``retain_finished=False`` leaves finished groups to
    ``on_step``."""

    def __init__(
        self,
        config: EngineConfig,
        policy: str | Any,
        executor: Executor,
        *,
        mechanics: Mechanics | None = None,
        policy_options: dict[str, Any] | None = None,
        observers: tuple = (),
        clock: Clock | None = None,
        retain_finished: bool = True,
    ) -> None:
        if not isinstance(config, EngineConfig):
            raise TypeError(f"config must be an EngineConfig, got {type(config).__name__}")
        self.hooks = PolicyHooks(policy, policy_options, observers)
        self.config = config = self.hooks.configure(config)
        self.mechanics = mechanics = installed(config.vllm_engine) if mechanics is None else mechanics
        if not isinstance(mechanics, Mechanics):
            raise TypeError(f"mechanics must be Mechanics (kvsched.mechanics.engines), got {type(mechanics).__name__}")
        if mechanics.vllm_engine != config.vllm_engine:
            raise ValueError(f"mechanics {mechanics.name!r} are not the config's vllm_engine {config.vllm_engine!r}")
        self.max_seq_len = config.model_len + mechanics.past_model_len  # the most tokens a sequence holds
        self.scheduler = sched = Scheduler(config, self.hooks, mechanics)
        self.executor = executor
        attach = getattr(executor, "attach", None)
        if attach is not None:  # an executor that reads this engine's block tables
            attach(sched.block_manager)
        self.clock = clock if clock is not None else executor.make_clock()
        self._groups: dict[str, SequenceGroup] = {}  # the engine's own; ``groups`` shows them as views
        self.finished: list[SequenceGroup] = []
        self._reported: list[SequenceGroup] = []  # let go (retired, not retained; taken): shown until the next step
        self.retain_finished = retain_finished
        self.num_requests = 0  # added so far; a group's index
        self.num_steps = 0
        self.num_blocks_swapped_in = 0
        self.num_blocks_swapped_out = 0
        self.new_seq_id = count().__next__  # the next sequence's id (a V1 fan-out's children take theirs too)
        self.completion = mechanics.completion(self)
        self.fast_path = executor.fast_path(self) if isinstance(executor, KnownTokens) else None
        sched.fast_path = self.fast_path
        self.fan_out = mechanics.fan_out(self) if mechanics.fan_out is not None else None
        self._idle_steps = 0
        self._idle_since = 0.0
        self._in_flight: SchedulerOutput | None = None  # a step scheduled and not yet completed
        self._result: StepResult | None = None  # what the executor made of it (begin_step)
        self.scheduled_at = 0.0  # when the last step was scheduled

    @property
    def policy_name(self) -> str:
        return self.hooks.name

    def add_request(self, request: Request | dict) -> SequenceGroup:
        """Queue a request (validated if given as a dict) until the policy admits it."""
        if self.hooks.in_hook is not None:  # checked inline: a run adds every request
            self._refuse_in_hook("add_request")
        if not isinstance(request, Request):
            request = Request.model_validate(request)
        if request.request_id in self._groups:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        eos = self.executor.eos_token_id
        group = SequenceGroup(request, self.num_requests, self.new_seq_id(), eos, self.max_seq_len)
        self._groups[request.request_id] = group
        self.num_requests += 1
        if group.n > 1 and self.fan_out is not None:
            self.fan_out.add(group)
        else:
            self.scheduler.add(group)
        self._idle_steps = 0  # new work: a stall is counted afresh
        return group

    def abort(self, request_id: str, status: SequenceStatus = SequenceStatus.FINISHED_ABORTED) -> bool:
        """End a request wherever it is, freeing every block it holds; False if it already ended. An engine embedding
        this one may end it with another finished ``status`` (a stop string, say)."""
        self._refuse_in_hook("abort")
        if not (status := SequenceStatus(status)).is_finished:  # a foreign value: ValueError, not AttributeError
            raise ValueError(f"{status.name} is not a finished state")
        group = self._groups.get(request_id)
        if group is None or group.is_finished:
            return False
        members = self.fan_out.members(group) if self.fan_out is not None else [group]
        if (out := self._in_flight) is not None:  # between schedule() and complete(): the step no longer runs it
            kept = [sg for sg in out.scheduled[out.lane_decodes :] if sg.group not in members]
            out.scheduled[out.lane_decodes :] = kept
        for member in members:
            self.scheduler.abort(member, self.clock.now(), status)
        self.retire(self.fan_out.ended(members) if self.fan_out is not None else members)
        return True

    def has_unfinished(self) -> bool:
        sched = self.scheduler
        return bool(sched.waiting or sched.running or sched.swapped)

    def _refuse_in_hook(self, call: str) -> None:
        hook = self.hooks.in_hook  # a hook may read its engine, not drive it
        if hook is not None:
            raise self.hooks.refuse(f"engine.{call}() called inside {hook}: a hook may not drive its own engine")

    @property
    def now(self) -> float:
        return self.clock.now()

    @property
    def groups(self) -> GroupMap:
        """Each request by id (finished too, unless ``retain_finished=False``) as a live read-only ``GroupView``."""
        return GroupMap(self._groups)

    @property
    def sequence_groups(self) -> Mapping[str, SequenceGroup]:
        """The engine's own groups, for what runs it (metrics, harnesses); a policy sees ``groups``."""
        return MappingProxyType(self._groups)

    @property
    def waiting(self) -> QueueView:
        """The waiting queue now, front first, as read-only views (a snapshot, as are ``running`` and ``swapped``)."""
        return QueueView(list(self.scheduler.waiting))

    @property
    def running(self) -> QueueView:
        return QueueView(list(self.scheduler.running))

    @property
    def swapped(self) -> QueueView:
        return QueueView(list(self.scheduler.swapped))

    def occupancy(self) -> tuple[int, int, int, int]:
        """The groups waiting, running and swapped out now and the free GPU blocks: counts alone (a fleet's reports)."""
        sched = self.scheduler
        return len(sched.waiting), len(sched.running), len(sched.swapped), sched.block_manager.gpu.num_free

    @property
    def cache(self) -> CacheView:
        return self.scheduler.cache_view

    def step(self, report: bool = True) -> StepReport | None:
        output = self.schedule()
        return self.complete(output, self.executor.execute(output), report=report)

    def schedule(self, hooks: PolicyHooks | None = None) -> SchedulerOutput:
        """The first half of ``step``, for a step run elsewhere (vLLM); ``hooks``: another policy's."""
        if self.hooks.in_hook is not None:
            self._refuse_in_hook("step")
        let_go(self._reported)  # their views show nothing from now on
        self.scheduled_at = self.clock.now()
        self._in_flight = self.scheduler.schedule(self.scheduled_at, hooks)
        return self._in_flight

    def begin_step(self) -> SchedulerOutput:
        """Schedule and execute a step, applied by ``end_step`` at its end (engines sharing one clock)."""
        output = self.schedule()
        self._result = result = self.executor.execute(output)
        if self.completion.timed:  # charged now: the step's end (next_event_time) counts the scheduler's time
            self.completion.charge(output, result)
        return output

    def next_event_time(self) -> float:
        return math.inf if self._result is None else self.clock.now() + self._result.duration

    @property
    def step_seconds(self) -> float:
        """The executor's time of the step under way (``begin_step``), as ``end_step`` will apply it; 0.0 if none is."""
        return 0.0 if self._result is None else self._result.duration

    def end_step(self, report: bool = True) -> StepReport | None:
        result, self._result = self._result, None
        return self.complete(self._in_flight, result, charged=True, report=report)

    def next_step_at(self, arrival: float) -> float:
        """When the next step starts: now, or at ``arrival`` (the next request's) after a step that ran nothing;
        ``StallError`` once it has been idle too long with nothing to come."""
        now, idle = self.clock.now(), self._idle_steps
        if not idle:
            return now
        if arrival != math.inf:  # nothing it can run until then
            return arrival
        if idle >= STALL_STEPS and now - self._idle_since >= STALL_SECONDS:
            raise StallError(
                f"policy {self.policy_name!r} scheduled nothing for {idle} steps "
                f"({now - self._idle_since:.0f} s) with {self.scheduler.stuck_report()}"
            )
        return now

    def steady_run(self, until: float, join=None, limit=math.inf, observe=None, fence=math.inf, resume=False):
        """The last step's repeats advanced at once (``FastPath.advance``); None without a fast path."""
        if self.hooks.in_hook is not None:  # checked inline: the loop asks after each step
            self._refuse_in_hook("steady_run")
        return None if self.fast_path is None else self.fast_path.advance(until, join, limit, observe, fence, resume)

    def take_finished(self) -> list[SequenceGroup]:
        """The requests that ended since the last call, handed over: the engine forgets them."""
        finished, self.finished = self.finished, []
        for group in finished:
            del self._groups[group.request_id]
        self._reported += finished  # their views show them until the next step
        return finished

    def complete(
        self, output: SchedulerOutput, result: StepResult, charged: bool = False, report: bool = True
    ) -> StepReport | None:
        """The second half of ``step``: ``output`` ran as ``result`` says; apply it and tell observers. Its report, or
        None where it was not asked for and no observer watches (``Engine.run`` with no ``on_step``)."""
        sched, completion = self.scheduler, self.completion
        self._in_flight = None
        if completion.timed and not charged:
            completion.charge(output, result)
        features = output.features  # as of before the completion changes the sequences
        self.clock.advance(result.duration)
        now = self.clock.now()
        finished = completion.apply(output, result.tokens, now)  # the scheduler's groups that ended (V1: children)
        if finished:  # as the engine reports them (a child by its parent), kept or let go
            finished = self.fan_out.ended(finished) if self.fan_out is not None else finished
            self.retire(finished)
        self.num_blocks_swapped_in += len(output.blocks_to_swap_in)
        self.num_blocks_swapped_out += len(output.blocks_to_swap_out)
        idle = output.is_empty and not finished
        if idle and not self._idle_steps:
            self._idle_since = self.scheduled_at
        self._idle_steps = self._idle_steps + 1 if idle else 0
        # None where nobody would read it (not asked for, no observer): no report made, nor its view
        report = (report or self.hooks.observes_steps) and StepReport(
            self.num_steps,
            now,
            result.duration,
            OutputView(output),
            tuple([g.view for g in finished]) if finished else (),
            len(sched.waiting),
            len(sched.running),
            len(sched.swapped),
            sched.cache_view,
            features,
            self.scheduled_at,
        )
        self.num_steps += 1
        if self.config.audit_every_step:
            self.check()
        self.hooks.on_step(report)
        if completion.timed:
            completion.ran(output, now)
        return report or None

    def retire(self, groups: list[SequenceGroup]) -> None:
        if self.retain_finished:
            self.finished += groups
        else:  # only the step's report keeps them, until the next step
            for group in groups:
                del self._groups[group.request_id]
            self._reported += groups

    def steps_ran(self, n: int) -> None:
        self.num_steps += n

    def run(
        self,
        requests: Iterable[Request] = (),
        on_step: Callable[[StepReport], None] | None = None,
        max_steps: int | None = None,
        *,
        in_order: bool = False,
    ) -> list[SequenceGroup]:
        """Feed ``requests`` at their arrival times and step until all finished. ``in_order``: read lazily, already in
        arrival order (a stream of millions); ``on_step.on_steps``, if defined, is told steady runs whole."""
        self._refuse_in_hook("run")
        integer = isinstance(max_steps, int) and not isinstance(max_steps, bool)  # an IntEnum counts, a bool does not
        clock, left = self.clock, math.inf if max_steps is None else int(max_steps) if integer else 0  # read once
        if left < 1:
            wrong = ValueError if integer else TypeError
            raise wrong(f"max_steps must be a positive int or None, got {type(max_steps).__name__} {quote(max_steps)}")
        arrivals = Arrivals(self, arriving(requests) if in_order else sorted(requests, key=lambda r: r.arrival_time))
        runs = self.fast_path is not None and (on_step is None or hasattr(on_step, "on_steps"))  # else: each step
        report = on_step is not None  # else a step's report is made only for the policy's observers
        observe = getattr(on_step, "on_steps", None)
        freeze = gc.isenabled() and not gc.get_freeze_count()  # as vLLM freezes its heap once started
        if freeze:
            gc.freeze()
        try:
            while arrivals.upcoming is not None or self.has_unfinished():
                if arrivals.at <= (now := clock.now()):
                    arrivals.admit(self.completion.seen_at(now))
                if not self.has_unfinished():
                    clock.wait_until(arrivals.at)
                    continue
                made = self.step(report)
                if on_step is not None:
                    on_step(made)
                left -= 1
                more = runs  # steady runs after a step, one after another while each ends a group
                while more and left:
                    run = self.steady_run(arrivals.at, arrivals.admit, left, observe)
                    left, more = left - len(run.started), run.finished
                if not left:  # max_steps taken
                    break
                if self._idle_steps:  # else the next step starts now
                    clock.wait_until(self.next_step_at(arrivals.at))
        finally:
            if freeze:
                gc.unfreeze()
        return self.finished

    def check(self) -> None:
        problems = self.scheduler.audit()
        if problems:
            raise AuditError("; ".join(problems[:5]) + (f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""))

    @property
    def leaked_blocks(self) -> int:
        """Blocks held with no request unfinished: 0 unless something is wrong."""
        return 0 if self.has_unfinished() else self.scheduler.block_manager.num_held_blocks


class Arrivals:
    """Requests fed to an engine as they arrive; ``at`` is the next one's arrival (infinity: none)."""

    def __init__(self, engine: Engine, requests: Iterable[Request]) -> None:
        self.add, self.requests = engine.add_request, iter(requests)
        self.upcoming = next(self.requests, None)
        self.at = math.inf if self.upcoming is None else self.upcoming.arrival_time

    def admit(self, now: float) -> float:
        upcoming = self.upcoming
        while upcoming is not None and upcoming.arrival_time <= now:
            self.add(upcoming)
            upcoming = next(self.requests, None)
        self.upcoming = upcoming
        self.at = math.inf if upcoming is None else upcoming.arrival_time
        return self.at


def arriving(requests: Iterable[Request]) -> Iterator[Request]:
    """``requests``, checked to come in arrival order."""
    last = None
    for request in requests:
        if last is not None and request.arrival_time < last.arrival_time:
            raise ValueError(f"request {request.request_id!r} arrives before {last.request_id!r}")
        yield (last := request)
