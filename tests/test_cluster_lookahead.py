"""Routing ahead (``Cluster(lookahead=True)``, for routers that declare ``reads_reports_only``) changes
how fast a fleet runs, never what it does: against the loop that routes each request at its arrival,
every view a router is shown, every route, row and step count is the same (Hypothesis, with a router
that reads every reported field); a router that declares it and reads a fresh signal is refused."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsched.cluster import Cluster, FleetSpec, ReplicaGroup
from kvsched.cluster.loop import MAX_AHEAD_S
from kvsched.routers import Route, hookimpl
from kvsched.routers.balance import VllmDp
from kvsched.routers.plugins import RouterError, RouterHooks
from kvsched.testing.cluster import assert_cluster
from kvsched.workloads.arrivals import Poisson
from kvsched.workloads.synthetic import SyntheticSpec
from tests.test_cluster_pinned import digest

REPORTED = ("reported_at", "num_waiting", "num_running", "num_swapped", "num_free_gpu_blocks")


class ReadsEveryReport:
    """A choice that turns on every reported field of every replica (any report differing shows), kept."""

    reads_reports_only = True

    def __init__(self) -> None:
        self.seen: list[tuple] = []

    @hookimpl
    def route_request(self, request, replicas):
        shown = tuple(tuple(getattr(r, f) for f in REPORTED) for r in replicas)
        self.seen.append((request.request_id, shown))
        pick = int(hashlib.sha256(repr(shown).encode()).hexdigest(), 16) % len(replicas)
        return Route(replicas[pick], "by the reports")

    @hookimpl
    def on_routed(self, request, replica):
        self.seen.append(("routed", request.request_id, replica.reported_at))


class RecordingDp(VllmDp):
    """vLLM's DP balancer, keeping what it was shown."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple] = []

    @hookimpl
    def route_request(self, request, replicas):
        self.seen.append(tuple((r.reported_at, r.num_waiting, r.num_running) for r in replicas))
        return super().route_request(request, replicas)


def fleet(router, replicas: int, staleness: float, policy: str, caching: bool, lookahead: bool) -> Cluster:
    settings_ = {
        "num_gpu_blocks": 96,
        "block_size": 16,
        "max_num_batched_tokens": 512,
        "max_model_len": 1024,
        "enable_prefix_caching": caching,
    }
    spec = FleetSpec(replicas=[ReplicaGroup(count=replicas, policy=policy, settings=settings_)], staleness_s=staleness)
    return Cluster(spec, RouterHooks(router), lookahead=lookahead)


@settings(max_examples=max(10, settings.default.max_examples // 6), deadline=None)
@given(
    router=st.sampled_from([ReadsEveryReport, RecordingDp]),
    replicas=st.integers(1, 10),
    staleness=st.sampled_from([1e-4, 0.005, 0.02, 0.05, 0.2, 1.0, 3600.0]),
    rate=st.floats(2.0, 120.0),
    n=st.integers(20, 250),
    policy=st.sampled_from(["vllm-default", "vllm-v1"]),
    caching=st.booleans(),
    seed=st.integers(0, 10_000),
)
def test_routing_ahead_shows_every_router_the_same_views_and_changes_no_result(
    router, replicas, staleness, rate, n, policy, caching, seed
):
    runs = []
    for lookahead in (False, True):
        chosen = router()
        cluster = fleet(chosen, replicas, staleness, policy, caching, lookahead)
        requests = list(SyntheticSpec(num_requests=n, arrivals=Poisson(rate=rate), seed=seed).iter_requests())
        cluster.run(requests)
        assert_cluster(cluster, requests)
        runs.append((cluster, chosen.seen))
    (plain, plain_seen), (ahead, ahead_seen) = runs
    assert ahead.ahead == min(staleness, MAX_AHEAD_S) and plain.ahead == 0.0  # a window as long as the trace is capped
    assert ahead_seen == plain_seen  # every report of every view, in order
    assert digest(ahead) == digest(plain)  # rows, routes, reasons, each replica's steps


def test_the_benchmark_fleet_routed_ahead_is_the_fleet_routed_at_arrival():
    """The speed benchmark's shape (vllm-dp, 50 ms, 64 replicas), small: same steps, rows and routes."""
    out = []
    for lookahead in (False, True):
        spec = FleetSpec(replicas=[ReplicaGroup(count=64)], router="vllm-dp", staleness_s=0.05)
        cluster = Cluster(spec, lookahead=lookahead)
        cluster.run(SyntheticSpec(num_requests=1500, arrivals=Poisson(rate=256.0), seed=11).iter_requests())
        out.append(digest(cluster))
    assert out[0] == out[1]


class DeclaresButReadsInFlight:
    reads_reports_only = True

    @hookimpl
    def route_request(self, request, replicas):
        return min(replicas, key=lambda r: (r.num_waiting, r.in_flight_requests))


class DeclaresButReadsTheCache:
    reads_reports_only = True

    @hookimpl
    def route_request(self, request, replicas):
        return max(replicas, key=lambda r: r.cached_prefix_tokens(request))


@pytest.mark.parametrize(
    "router, read",
    [(DeclaresButReadsInFlight, "in_flight_requests"), (DeclaresButReadsTheCache, "cached_prefix_tokens")],
)
def test_a_router_that_declares_reports_only_and_reads_a_fresh_signal_is_refused(router, read):
    cluster = fleet(router(), 3, 0.05, "vllm-v1", True, True)
    with pytest.raises(RouterError, match=f"declares reads_reports_only but read {read}"):
        cluster.run(SyntheticSpec(num_requests=10, arrivals=Poisson(rate=5.0), seed=1).iter_requests())


def test_without_staleness_or_the_declaration_nothing_is_routed_ahead():
    assert fleet(DeclaresButReadsInFlight(), 3, 0.0, "vllm-v1", False, True).ahead == 0.0
    assert fleet(RecordingDp(), 3, 0.05, "vllm-v1", False, True).ahead == 0.05
    assert fleet("least-outstanding", 3, 0.05, "vllm-v1", False, True).ahead == 0.0  # it reads fresh counts


def test_declaring_reports_only_and_observing_finishes_is_refused():
    class Both(ReadsEveryReport):
        @hookimpl
        def on_finished(self, request, replica):
            pass

    with pytest.raises(RouterError, match="declares reads_reports_only and implements on_finished"):
        RouterHooks(Both())


def test_an_observing_hook_sees_reports_as_stale_as_a_routing_call():
    """on_routed is told the choice at the request's arrival; its view shows what a routing call then
    shows (it used to show the newest report, and later routing calls then saw reports too new)."""
    router = ReadsEveryReport()
    cluster = fleet(router, 2, 0.2, "vllm-v1", False, True)
    requests = list(SyntheticSpec(num_requests=60, arrivals=Poisson(rate=30.0), seed=4).iter_requests())
    cluster.run(requests)
    arrival = {r.request_id: r.arrival_time for r in requests}
    observed = [(rid, at) for kind, rid, at in (s for s in router.seen if s[0] == "routed")]
    assert observed and all(at <= arrival[rid] - 0.2 or at == 0.0 for rid, at in observed)
