"""A replica's steady runs behind a waiting queue change how fast a fleet runs, never what. Such a run goes on
through the requests routed to the replica (they join its queue as the run goes, as they join ``Engine.run``'s) and
keeps every step's report; against replicas that step one at a time while requests wait (as they did before), every
view a router is shown, every route, row, step count and busy time is the same, routed at arrival or ahead
(Hypothesis, with a router that reads every reported field, and one that reads the fresh counts too)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvsched.cluster import Cluster
from kvsched.core.engine import Engine
from kvsched.executors.steady_runs import NO_RUN
from kvsched.routers import hookimpl
from kvsched.testing.cluster import assert_cluster
from kvsched.workloads.arrivals import Poisson
from kvsched.workloads.synthetic import SyntheticSpec
from tests.test_cluster_lookahead import ReadsEveryReport, RecordingDp, fleet
from tests.test_cluster_pinned import digest


class ReadsFreshSignalsToo(ReadsEveryReport):
    """Every reported field and the fresh counts (in flight, in prefill): read at each arrival, as the replica is."""

    reads_reports_only = False

    @hookimpl
    def route_request(self, request, replicas):
        fresh = tuple((r.in_flight_requests, r.in_prefill_requests, r.in_prefill_tokens) for r in replicas)
        self.seen.append(("fresh", request.request_id, fresh))
        return super().route_request(request, replicas)


def one_step_at_a_time_while_requests_wait(cluster: Cluster) -> None:
    """Its replicas take no steady run behind a refused head: each such step is taken alone, with its report."""
    for r in cluster.replicas:
        engine, fast = r.engine, r.engine.fast_path
        if fast is not None:

            def steady_run(*args, engine=engine, fast=fast):
                behind_a_head = fast.steady is not None and not fast.steady.arrivals
                return NO_RUN if behind_a_head else Engine.steady_run(engine, *args)

            engine.steady_run = steady_run


def replay(router, replicas, staleness, rate, n, seed, lookahead, runs_while_waiting):
    """The fleet's results, what its router was shown, and its replicas' full steps (``begin_step``) and busy times."""
    chosen = router()
    cluster = fleet(chosen, replicas, staleness, "vllm-default", False, lookahead)
    if not runs_while_waiting:
        one_step_at_a_time_while_requests_wait(cluster)
    full = [0]
    for r in cluster.replicas:
        begin = r.engine.begin_step

        def counted(begin=begin):
            full[0] += 1
            return begin()

        r.engine.begin_step = counted
    requests = list(SyntheticSpec(num_requests=n, arrivals=Poisson(rate=rate), seed=seed).iter_requests())
    cluster.run(requests)
    assert_cluster(cluster, requests)
    return digest(cluster), chosen.seen, [r.busy_s for r in cluster.replicas], full[0]


@settings(max_examples=max(10, settings.default.max_examples // 6), deadline=None)
@given(
    router=st.sampled_from([ReadsEveryReport, RecordingDp, ReadsFreshSignalsToo]),
    replicas=st.integers(1, 6),
    staleness=st.sampled_from([0.0, 1e-4, 0.02, 0.05, 0.2, 1.0]),
    rate=st.floats(2.0, 120.0),
    n=st.integers(20, 200),
    lookahead=st.booleans(),
    seed=st.integers(0, 10_000),
)
def test_runs_behind_a_waiting_queue_show_every_router_the_same_views_and_change_no_result(
    router, replicas, staleness, rate, n, lookahead, seed
):
    fleet_args = (router, replicas, staleness, rate, n, seed, lookahead)
    stepping, running = replay(*fleet_args, False), replay(*fleet_args, True)
    assert running[0] == stepping[0]  # rows, routes, reasons, each replica's steps
    assert running[1] == stepping[1]  # every report of every view, in order
    assert running[2] == stepping[2]  # each replica's busy seconds, summed as the steps one at a time summed them
    assert running[3] <= stepping[3]


def test_a_fleet_under_kv_pressure_takes_runs_behind_its_waiting_queues():
    """Routed ahead, where requests routed to a replica join its run: fewer full steps, the same fleet."""
    fleet_args = (RecordingDp, 3, 0.05, 40.0, 200, 1, True)
    stepping, running = replay(*fleet_args, False), replay(*fleet_args, True)
    assert running[:3] == stepping[:3]
    assert running[3] < stepping[3] // 2


def test_a_request_arriving_at_a_step_end_counts_in_the_next_report_only():
    """A request routed here that arrives just as a step of a run behind a refused head ends joins the queue as the
    next step starts, and the report at that step end does not count it, as it did not when each step ended with its
    own event (steps end, then requests arrive). A second request, arriving a staleness later, is shown that report."""
    stale = 0.25
    base = list(SyntheticSpec(num_requests=80, arrivals=Poisson(rate=20.0), seed=4).iter_requests())

    def run(requests, runs_while_waiting):
        router = ReadsEveryReport()
        cluster = fleet(router, 1, stale, "vllm-default", False, True)
        if not runs_while_waiting:
            one_step_at_a_time_while_requests_wait(cluster)
        engine, ends = cluster.replicas[0].engine, []
        end_step = engine.end_step

        def ended(**kwargs):  # each full step's end, and what waits then
            made = end_step(**kwargs)
            ends.append((engine.now, engine.occupancy()[0]))
            return made

        engine.end_step = ended
        cluster.run(requests)
        return digest(cluster), router.seen, ends

    ends = run(base, False)[2]
    # Step ends between two with requests waiting, where the view a staleness later reads exactly that time.
    at = [t for (t, w), (_, w2) in zip(ends, ends[1:]) if w and w2 and (t + stale) - stale == t]
    for t in at[:: len(at) // 15][:6]:
        first = base[0].model_copy(update={"request_id": "at-the-step-end", "arrival_time": t})
        second = base[1].model_copy(update={"request_id": "a-staleness-later", "arrival_time": t + stale})
        requests = sorted([*base, first, second], key=lambda r: r.arrival_time)
        stepping, running = run(requests, False), run(requests, True)
        assert running[:2] == stepping[:2]
        shown = next(views for rid, *views in stepping[1] if rid == "a-staleness-later")
        assert shown[0][0][0] == t  # the report of that step end
