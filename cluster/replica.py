"""One replica of a fleet: its own engine, driven a step at a time by the cluster's clock, and what a
router may know of it (its step reports, kept as long as a stale view may still show them, and
the router's own in-flight counts)."""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from typing import TYPE_CHECKING, NamedTuple

from kvsched.core.engine import Engine
from kvsched.core.request import Request
from kvsched.routers.replica import InPrefill
from kvsched.routers.view import Signals

if TYPE_CHECKING:
    from kvsched.core.sequence import SequenceGroup

MIXED, PREFILL, DECODE = "mixed", "prefill", "decode"


class Routed(NamedTuple):
    """A request routed to a replica, and when it arrives there (a P/D decode part: when its KV has moved, later
    than the arrival time it carries)."""

    at: float
    request: Request


class Replica:
    """An engine behind the router. ``begin_step`` schedules and executes a step (returning when it
    ends); ``end_step`` applies it at that time, as ``Engine.step`` does in one call. Its reports are
    kept (time-stamped) for as long as a view ``staleness`` old may still show them.

    The engine retains its finished groups (``retain_finished``) until ``end_step`` takes them, so
    that a steady run, which reports to no observer, loses none. What routers' views read of it is
    ``routers/replica.py``'s ``RoutedReplica``."""

    # Slots: the loop reads a replica at every event, and past 30 attributes CPython 3.11 gives up an instance dict's
    # shared keys (each read then a dict lookup: 1.5 % of a 16-replica fleet's instructions).
    __slots__ = (
        *("name", "role", "engine", "profile_name", "staleness", "index", "policy_name", "block_size"),
        *("num_gpu_blocks", "in_flight_requests", "in_flight_tokens", "_unanswered", "_unanswered_groups"),
        *("tracks_first_tokens", "routed", "_joined", "steady_runs", "_reports", "_stepping", "resumable", "joins"),
        *("_cache", "on_step", "on_steps", "reported", "held", "busy", "generation", "steps", "busy_s", "requests"),
        "cached_by_request",
    )

    def __init__(
        self, name: str, role: str, engine: Engine, profile_name: str, staleness: float, steady_runs: bool = True
    ) -> None:
        self.name, self.role, self.engine, self.profile_name = name, role, engine, profile_name
        self.staleness = staleness
        self.index = 0  # its place in the fleet, set by the cluster
        self.policy_name, self.block_size = engine.policy_name, engine.config.block_size  # read by routers' views
        self.num_gpu_blocks = engine.config.num_gpu_blocks
        self.in_flight_requests = 0
        self.in_flight_tokens = 0
        # Of those, the ones whose first token has not come back (the router sees each response's first token), by
        # request id: their prompt tokens, and the groups of those that arrived. Pruned when read (in_prefill); kept
        # only for a router that may read it (the cluster sets tracks_first_tokens).
        self._unanswered: dict[str, int] = {}
        self._unanswered_groups: dict[str, SequenceGroup] = {}
        self.tracks_first_tokens = True
        # The requests routed to it that have not arrived yet, with their arrival times (a steady run takes in those
        # that change nothing for its policy: ``begin_step``), and the times of those it took in during its last run.
        self.routed: deque[Routed] = deque()
        self._joined: list[float] = []
        # Steady runs, where the engine has a fast path (a decode replica of P/D takes none: a prompt handed over from
        # the prefill pool may arrive at any moment, and would wait for the run's end).
        self.steady_runs = steady_runs and engine.fast_path is not None and engine.fast_path.runs is not None
        self._reports = deque([Signals(0.0, 0, 0, 0, engine.cache.num_free_gpu_blocks)])
        self._stepping = False  # a step under way (begin_step); else its last was a steady run, applied as it ran
        # Its last step a steady run stopped by an arrival, nothing added since but what the run would have taken in
        # (``joins``): it goes on coasting.
        self.resumable = False
        self.joins = False
        self._cache = engine.cache if engine.config.enable_prefix_caching else None
        self.on_step = self.on_steps = None  # a single run's observers (``alone``)
        self.reported = True  # its reports kept for a router's views (a single run, with no router, keeps none)
        self.held: list[Request] = []  # what arrived during the step under way (it joins once the step has ended)
        self.busy = False  # a step under way or one due: an event of this replica is on the cluster's heap
        self.generation = 0  # events of older generations on the heap are void
        # Measured while it runs.
        self.steps = 0
        self.busy_s = 0.0
        self.requests = 0
        # With prefix caching: per request in flight, by its index in the engine (which a V1 fan-out's children share).
        self.cached_by_request: dict[int, int] = {}

    # ---------------------------------------------------------------- what a router may read
    def signals_as_of(self, t: float) -> Signals:
        """The newest report true at ``t`` or before (the first report if none; times asked never go back)."""
        reports = self._reports
        while len(reports) > 1 and reports[1].time <= t:
            reports.popleft()
        return reports[0]

    def cached_prefix_blocks(self, hashes: list[int]) -> int:
        """Leading blocks of ``hashes`` that its GPU prefix cache holds now."""
        return 0 if self._cache is None else self._cache.cached_prefix_blocks(hashes)

    def in_prefill(self) -> InPrefill:
        """The requests the router sent here whose first token has not come back (queued or in prefill), and
        their prompt tokens: Dynamo's active prefill load. Counted when read, from the groups' first tokens
        (each request is dropped once answered), so the steps pay nothing for it."""
        unanswered, groups = self._unanswered, self._unanswered_groups
        answered = [rid for rid, group in groups.items() if self._answered(group)]
        for rid in answered:
            del unanswered[rid]
            del groups[rid]
        return InPrefill(len(unanswered), sum(unanswered.values()))

    def _answered(self, group) -> bool:
        """Whether ``group``'s first token is out (a V1 fan-out's: its first child's)."""
        if group.first_token_time is not None:
            return True
        children = self.engine.fan_out.children.get(group) if self.engine.fan_out is not None else None
        return children is not None and any(c.first_token_time is not None for c in children)

    # --------------------------------------------------------------------------- driving it
    def alone(self, on_step) -> None:
        """Make it a single engine's run, the fleet of one: no router reads it, so it keeps no reports, nor what its
        prefix cache found; ``on_step`` (the run's observers) is told each step's report, and each steady run whole
        where it takes them (``on_steps``), as ``Engine.run`` tells them (for one that does not, it takes no steady
        run)."""
        self.tracks_first_tokens = self.reported = False
        self._cache = None
        self.on_step, self.on_steps = on_step, getattr(on_step, "on_steps", None)
        self.steady_runs = self.steady_runs and (on_step is None or self.on_steps is not None)

    def sent(self, request: Request) -> None:
        """The router chose it for ``request`` (its in-flight counts are the router's, kept as it sends; a
        decode replica of P/D is sent prompts already answered)."""
        self.in_flight_requests += 1
        self.in_flight_tokens += request.prompt_len
        self.requests += 1
        if self.tracks_first_tokens and self.role != DECODE:
            self._unanswered[request.request_id] = request.prompt_len

    def arrive(self, request: Request) -> None:
        """``request``, routed here, arrives now: it joins the engine's queue, unless a steady run took it in. One
        arriving while a step runs joins once the step has ended and been told (``end_step``), as ``Engine.run``
        admits it: a step that scheduled nothing still counts as idle, and the new request is stepped at once."""
        routed = self.routed
        if routed and routed[0].request is request:
            routed.popleft()
            if self._stepping:
                self.held.append(request)
            else:
                self.add(request)

    def add(self, request: Request) -> None:
        """``request`` arrives: it joins the engine's queue. A steady run it stopped goes on coasting where arrivals
        join the queue as it goes (``joins``: ``Engine.run``'s takes them in; the policy is not asked), else a step
        asks the policy again."""
        self.resumable = self.resumable and self.joins
        self._queue(request)

    def _queue(self, request: Request) -> None:
        """``request`` joins the engine's queue."""
        group = self.engine.add_request(request)
        if self._unanswered and request.request_id in self._unanswered:
            self._unanswered_groups[request.request_id] = group

    def release(self, request: Request) -> None:
        """The router learns that ``request`` left this replica."""
        self.in_flight_requests -= 1
        self.in_flight_tokens -= request.prompt_len
        if self._unanswered:
            self._unanswered.pop(request.request_id, None)
            self._unanswered_groups.pop(request.request_id, None)

    def begin_step(self, t: float, fence: float, cuts=()) -> float:
        """Start the replica's next step at ``t`` (the cluster's now); the time it ends. While the last step is
        steady, advance its repeats at once, as ``Engine.run`` does (the engine's steady run: same results, a
        fraction of the cost), up to ``fence``, the fleet's next request not yet routed (the router must see every
        replica as it is at its arrival), and up to the next request routed here where nothing waits (it changes
        the policy's calls); behind a waiting queue's refused head, the requests routed here join the queue as the
        run goes (``_join``), as they join ``Engine.run``'s.

        ``cuts`` (ascending) are the times of the requests routed ahead: where nothing waits, the run keeps, at
        the first step end at or after each one in (t, run's end), the report that an arrival stopping the run
        there would have kept (so a fleet routed ahead reports as one routed at each arrival). Where requests
        wait, the run stands for steps a replica takes one at a time and ends with a report each (before runs
        were taken there), so it keeps every step's report."""
        engine = self.engine
        if not self.resumable:  # else its clock is at t already
            engine.clock.wait_until(t)
        if self.reported:  # here, not when a report is kept: arrivals up to t, which read older ones, have been routed
            self._trim(t)
        routed = self.routed
        until = min(routed[0].at, fence) if routed else fence
        # A run where the fast path holds a steady step (else the last step was not one: straight to a full step).
        if self.steady_runs and t < until and engine.fast_path.steady is not None:
            self._joined.clear()
            run = engine.steady_run(until, self._join, math.inf, self.on_steps, fence, self.resumable)
            self.resumable, self.joins = run.stopped and bool(run.started), run.joins
            if run.started:
                now = engine.clock.now()
                # The counts hold until the run's last step (but for the arrivals it takes in): its reports show them.
                if run.joins:  # behind a refused head: it stands for steps that were taken one at a time
                    if self.reported:
                        self._report_steps(run)
                    busy = self.busy_s
                    for duration in run.durations:  # as the steps one at a time added them
                        busy += duration
                    self.busy_s = busy
                else:
                    if cuts and self.reported:
                        self._report_cuts(cuts, t, run)
                    self.busy_s += now - t
                self._stepping = False
                self.steps += len(run.started)
                return now
        output = engine.begin_step()
        self._stepping = True
        if self._cache is not None:  # what each request's first admission found in the prefix cache
            found = self.cached_by_request
            for sg in output.scheduled[output.lane_decodes :]:
                if sg.is_prefill and sg.group.index not in found:
                    found[sg.group.index] = sg.num_cached_tokens
        return engine.next_event_time()

    def _join(self, now: float) -> float:
        """A steady run's step starts at ``now``: the requests routed here that arrived by then join the queue (the
        run's ``join``); the next one's arrival (infinity: none yet routed)."""
        routed, joined = self.routed, self._joined
        while routed and routed[0].at <= now:
            arrival = routed.popleft()
            joined.append(arrival.at)
            self._queue(arrival.request)
        return routed[0].at if routed else math.inf

    def _report_steps(self, run) -> None:
        """The report of each step end of ``run`` but its last (the END event keeps that one), as the steps one at a
        time kept them: the requests that joined the queue count from the first step end after they arrived."""
        waiting, running, swapped = run.num_waiting, run.num_running, run.num_swapped
        started, free, joined, reports = run.started, run.free_after, self._joined, self._reports
        j, last = 0, len(joined)
        for k in range(1, len(started)):
            end = started[k]  # step k - 1 ends where step k starts
            while j < last and joined[j] < end:
                j += 1
            reports.append(tuple.__new__(Signals, (end, waiting + j, running, swapped, free[k - 1])))

    def _report_cuts(self, cuts, t: float, run) -> None:
        """The reports of the steady ``run`` just taken from ``t``, at the first step end at or after each cut
        past ``t``: what it would have kept had an arrival at each stopped it there. The run's last step
        end is not one: the END event there keeps that report, arrivals until then included."""
        started, free = run.started, run.free_after  # step j ends where step j + 1 starts
        reports, last, k, kept = self._reports, len(started), 1, 0
        for cut in cuts:
            if cut <= t:
                continue
            k = bisect_left(started, cut, k)
            if k == last:
                break
            if k != kept:  # several arrivals in one step: one report
                report = (started[k], run.num_waiting, run.num_running, run.num_swapped, free[k - 1])
                reports.append(tuple.__new__(Signals, report))
                kept = k

    def report_steady(self, t: float) -> None:
        """The report at ``t``, the end of a steady run (its counts held through it): ``end_step``'s, and all of it
        where an arrival stopped the run (``resumable``: nothing ended in it, nothing was added since)."""
        waiting, running, swapped, free = self.engine.occupancy()  # unpacked: a star call into Signals costs more
        # Signals(...) without its __new__'s Python frame, as a steady run's Run is made: one report most fleet steps
        self._reports.append(tuple.__new__(Signals, (t, waiting, running, swapped, free)))

    def end_step(self) -> list:
        """Apply the step under way (the clock moves to its end; a steady run was applied as it ran), keep
        its report for the router, and take the groups that ended out of the engine (they are the
        cluster's records now)."""
        engine = self.engine
        if self._stepping:  # else a steady run, applied as it ran: its counts held through it
            self._stepping = False
            self.busy_s += engine.step_seconds  # the step's own, as Engine.step's report gives it
            if self.on_step is None:  # no report made that no one reads (its counts are read below)
                engine.end_step(report=False)
            else:
                self.on_step(engine.end_step())
            if self.held:  # the arrivals during the step join now
                for request in self.held:
                    self.add(request)
                self.held.clear()
            self.steps += 1
        if self.reported:
            self.report_steady(engine.clock.now())
        return engine.take_finished() if engine.finished else []

    def _trim(self, t: float) -> None:
        """Forget the reports no view can show any more (views ask at ``t − staleness`` or later)."""
        reports, oldest = self._reports, t - self.staleness
        while len(reports) > 1 and reports[1].time <= oldest:
            reports.popleft()


class LaggingReplica(Replica):
    """A replica whose engine's scheduler sees an arrival later than it comes (its completion step's ``seen_at``: async
    scheduling, where a request arriving while a step runs is first seen by the step after next). A request routed
    here counts toward its load at once, but waits here until a step starts whose scheduler saw it, and joins the
    engine's queue then, as ``Engine.run`` admits it; a replica whose scheduler sees at once pays nothing for it."""

    __slots__ = ("unseen",)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.unseen: deque[Request] = deque()  # arrived, in arrival order, not yet seen by its scheduler
        # No steady runs (its timed steps have no fast path anyway): a run's ``_join`` would queue what it has not seen.
        self.steady_runs = False

    def add(self, request: Request) -> None:
        self.unseen.append(request)  # it joins the engine's queue (``Replica.add``) once seen: ``_admit``

    def begin_step(self, t: float, fence: float, cuts=()) -> float:
        self._admit(t)
        return super().begin_step(t, fence, cuts)

    def end_step(self) -> list:
        finished = super().end_step()
        self._admit(self.engine.clock.now())  # now, not at the next start: the cluster sees the work it has
        return finished

    def _admit(self, now: float) -> None:
        """Queue the requests that have arrived by when the scheduler of a step starting at ``now`` looks."""
        unseen, seen = self.unseen, self.engine.completion.seen_at(now)
        while unseen and unseen[0].arrival_time <= seen:
            super().add(unseen.popleft())


def replica_class(engine: Engine) -> type[Replica]:
    """The replica that drives ``engine``: a ``LaggingReplica`` where its scheduler sees arrivals late."""
    return LaggingReplica if engine.completion.lags else Replica
