"""The cluster loop: one global virtual clock over replica engines, in time order.

A heap holds each replica's next event: the end of its step under way, a step due, or a request
routed to it arriving. A request is routed, with each replica's view as of its arrival time t −
staleness, once nothing before that is left to run: at t for a router that reads fresh signals,
up to a staleness ahead for one that reads only reports. A replica whose step ends applies it at
that moment, and one that has work starts its next step as soon as the requests arriving at that
same instant are in its queue (as ``Engine.run`` does).
Under P/D disaggregation a request is routed to the prefill pool on arrival, runs its prompt
there (one token), and is routed to the decode pool once its KV has been transferred. A single
engine's run (``engine run``) is the loop's one-replica case with no router (``fleet_of_one.py``).
"""

from __future__ import annotations

import gc
import heapq
import math
from collections import deque
from collections.abc import Callable, Iterable
from itertools import count
from typing import Any

from kvsched.cluster.records import FleetRecords
from kvsched.cluster.replica import DECODE, PREFILL, Replica, Routed
from kvsched.cluster.spec import FleetError, FleetSpec
from kvsched.core.engine import arriving
from kvsched.core.request import Request
from kvsched.errors import StallError
from kvsched.routers.plugins import RouterHooks

END, ARRIVE, SCHEDULE = 0, 1, 2  # heap event kinds; at one instant: steps end, then requests arrive, then steps start
# How far ahead a request may be routed, at most: any window up to the staleness gives the same results,
# and one as long as a trace (an hour of staleness, the most a spec takes) would hold all of a stream in memory.
MAX_AHEAD_S = 1.0


class Cluster:
    """A fleet behind a router, built from a ``FleetSpec``; ``run(requests)`` replays them. With no router
    (``FleetOfOne``), one replica takes every request."""

    def __init__(self, spec: FleetSpec, router: RouterHooks | None = None, lookahead: bool = True) -> None:
        self.spec = spec
        self.router = router if router is not None else RouterHooks(spec.router, spec.router_options)
        self.replicas: list[Replica] = spec.build()
        self.staleness = spec.staleness_s
        self.disaggregated = spec.disaggregated
        self.prefill_pool = [r for r in self.replicas if r.role == PREFILL] if self.disaggregated else self.replicas
        self.decode_pool = [r for r in self.replicas if r.role == DECODE]
        self.records = FleetRecords(self.replicas)
        for r in self.replicas:  # what only a router that reads fresh signals can see is kept only for one
            r.tracks_first_tokens = not self.router.reads_reports_only
        self.now = 0.0
        # Routed ahead: a router that reads only reports (``reads_reports_only``) can choose for a request
        # arriving at t once every report true at t − staleness is known, before the replicas reach t;
        # each replica's steady run then stops only at the requests routed to it (same results).
        self.ahead = (
            min(self.staleness, MAX_AHEAD_S)
            if lookahead and self.router.reads_reports_only and not self.disaggregated
            else 0.0
        )

    def run(self, requests: Iterable[Request], on_finished: Callable[[int], Any] | None = None) -> FleetRecords:
        """Route and serve ``requests`` (in arrival order, read as they arrive) until every one has ended; the records,
        closed. The objects that exist as it starts (the fleet's engines, the requests given as a list) are kept out of
        the collector's passes, as ``Engine.run`` keeps them (``gc.freeze()``, undone at the end; skipped if the
        caller froze any)."""
        freeze = gc.isenabled() and not gc.get_freeze_count()
        if freeze:
            gc.freeze()
        try:
            self._run(requests, on_finished)
        finally:
            if freeze:
                gc.unfreeze()
        return self.records.close()

    def _run(self, requests: Iterable[Request], on_finished: Callable[[int], Any] | None) -> None:
        heap: list[tuple] = []
        tick = self._tick = count()
        source = arriving(requests)
        upcoming = next(source, None)
        handoffs: list[tuple] = []  # P/D: (time, seq, request for the decode pool)
        pending: deque[float] = deque()  # times of the requests routed that have not arrived yet (routed ahead)
        router, replicas, records = self.router, self.replicas, self.records
        staleness, ahead = self.staleness, self.ahead
        reports_only = ahead > 0
        push, pop = heapq.heappush, heapq.heappop
        inf = math.inf

        def wake(r: Replica, t: float) -> None:
            r.generation += 1
            r.busy = True
            push(heap, (t, SCHEDULE, next(tick), r.index, r.generation))

        while True:
            ta = upcoming.arrival_time if upcoming is not None else inf
            handoff = handoffs and handoffs[0][0] <= ta  # P/D: a prompt done is routed before an arrival at its time
            tr = handoffs[0][0] if handoff else ta  # the next request to route
            # Route it once nothing before its view's time (steps ending then included) is left to run.
            if tr != inf and (not heap or heap[0][0] > tr - ahead or (heap[0][0] == tr - ahead and heap[0][1] != END)):
                if handoff:
                    request = pop(handoffs)[2]
                    pool = self.decode_pool
                else:
                    request, upcoming = upcoming, next(source, None)
                    pool = self.prefill_pool
                    if router is not None:
                        records.arrived(request)
                        if self.disaggregated:
                            request = records.prefill_part(request)
                if router is None:  # a single engine, the fleet of one (``FleetOfOne``): each request goes to it
                    r = pool[0]
                else:
                    r, reason = router.route(request, pool, tr, staleness, reports_only)
                    records.routed(request, r, tr, reason)
                    r.sent(request)
                    router.routed(request, r, tr, staleness, reports_only)
                pending.append(tr)
                r.routed.append(tuple.__new__(Routed, (tr, request)))  # Routed(...) with no frame: one a request
                push(heap, (tr, ARRIVE, next(tick), r.index, request))
                continue
            if not heap:
                break
            t, kind, _, i, event = pop(heap)
            r = replicas[i]
            self.now = t
            if kind == ARRIVE:  # a request routed to r arrives: it joins r's queue (unless r's steady run took it in)
                pending.popleft()
                r.arrive(event)
                if not r.busy:
                    wake(r, t)
                continue
            if event != r.generation:
                continue
            tn = pending[0] if pending else tr  # the next request to arrive anywhere
            if kind == END and r.resumable:  # most of a fleet's steps: a steady run an arrival stopped goes on
                if r.reported:
                    r.report_steady(t)
                if tn <= t:  # requests arriving now join its queue first
                    push(heap, (t, SCHEDULE, next(tick), i, r.generation))
                    continue
            elif kind == END:
                finished = r.end_step()
                if finished:
                    self._finished(r, finished, t, handoffs, on_finished)
                if not r.engine.has_unfinished():
                    r.busy = False
                    continue
                try:  # after a step that ran nothing it waits for the next arrival anywhere, as Engine.run does
                    at = r.engine.next_step_at(tn)
                except StallError as stall:
                    if router is None:  # a single engine's: as Engine.run says it
                        raise
                    raise StallError(f"replica {r.name}: {stall}") from None
                if tn <= at:  # requests arriving by then join its queue first
                    push(heap, (at, SCHEDULE, next(tick), i, r.generation))
                    continue
            # A steady run stops at the next unrouted request (it may be routed here), or takes in its own first.
            push(heap, (r.begin_step(t, ta, pending), END, next(tick), i, r.generation))

    def _finished(self, r: Replica, groups: list, t: float, handoffs: list, on_finished) -> None:
        """Requests that ended on ``r`` at ``t``: recorded, told to the router; under P/D a finished
        prompt is sent on to the decode pool once its KV has moved."""
        records, router, ended = self.records, self.router, len(groups)
        for group in groups:
            if router is None:  # a single engine's: its records alone
                records.done(group, r)
                continue
            request = group.request
            r.release(request)
            router.finished(request, r, t, self.staleness)
            if r.role == PREFILL:
                follow = records.prefill_done(group, r)
                if follow is not None:
                    moved = self.spec.transfer.seconds(request.prompt_len, r.engine.executor.profile.kv_bytes_per_token)
                    heapq.heappush(handoffs, (t + moved, next(self._tick), follow))
                    ended -= 1
                    continue
            else:
                records.done(group, r)
        if ended and on_finished is not None:
            on_finished(ended)


def run_cluster(
    requests: Iterable[Request], spec: FleetSpec, on_finished: Callable[[int], Any] | None = None
) -> FleetRecords:
    """Build the fleet of ``spec`` and replay ``requests`` through it (the Python API of ``engine run --replicas``)."""
    if not isinstance(spec, FleetSpec):
        raise FleetError(f"a fleet is a FleetSpec, got {type(spec).__name__}")
    return Cluster(spec).run(requests, on_finished)
