"""The invariants a fleet keeps, whatever its router, replicas and staleness (issue 24): no request
is lost or served twice across replicas, none leaks a block anywhere, and each timeline is in order.

``check_cluster(cluster, requests)`` returns the violations after a run (empty if none);
``assert_cluster`` raises ``InvariantViolation`` for the first. ``tests/test_cluster.py`` runs them
on random fleets, routers and workloads with Hypothesis.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from kvsched.errors import AuditError
from kvsched.testing.invariants import InvariantViolation

if TYPE_CHECKING:
    from kvsched.cluster.loop import Cluster
    from kvsched.core.request import Request

NO_REQUEST_LOST = "no-request-lost"
NO_REQUEST_DUPLICATED = "no-request-duplicated"
NO_LEAK_ANYWHERE = "no-leak-anywhere"
ROUTES_IN_POOL = "routes-in-pool"
TIMELINES_IN_ORDER = "timelines-in-order"

CLUSTER_INVARIANTS = {
    NO_REQUEST_LOST: "every request that arrived has exactly one record, and no replica still holds one",
    NO_REQUEST_DUPLICATED: "no request is recorded twice, or routed twice to one pool, or run by two replicas of a "
    "pool",
    NO_LEAK_ANYWHERE: "every replica's blocks are free and its allocator audit passes; the router's in-flight and "
    "in-prefill counts are back to 0",
    ROUTES_IN_POOL: "each request was routed into the pool of its phase: mixed, or prefill then decode",
    TIMELINES_IN_ORDER: "arrival <= first scheduled <= first token <= finish, in the fleet's one clock",
}


def check_cluster(cluster: Cluster, requests: list[Request]) -> list[tuple[str, str]]:
    """Every violation of ``CLUSTER_INVARIANTS`` after ``cluster`` ran ``requests``: (invariant, what)."""
    problems: list[tuple[str, str]] = []
    rec = cluster.records
    ids = [row.request_id for row in rec.named_rows()]
    counts = Counter(ids)
    expected = {r.request_id for r in requests}
    lost = expected - set(counts)
    if lost or rec.num_arrived != len(requests):
        problems.append(
            (
                NO_REQUEST_LOST,
                f"{len(lost)} of {len(requests)} requests have no record (e.g. {sorted(lost)[:3]}); arrived "
                f"{rec.num_arrived}",
            )
        )
    for r in cluster.replicas:
        if r.engine.has_unfinished() or r.engine.sequence_groups:
            problems.append(
                (NO_REQUEST_LOST, f"{r.name} still holds {len(r.engine.sequence_groups)} requests after the run")
            )
    twice = [i for i, n in counts.items() if n > 1]
    if twice:
        problems.append((NO_REQUEST_DUPLICATED, f"{len(twice)} requests recorded more than once, e.g. {twice[:3]}"))
    routed = Counter((route.request_id, route.pool) for route in rec.routes)
    again = [k for k, n in routed.items() if n > 1]
    if again:
        problems.append((NO_REQUEST_DUPLICATED, f"routed twice into one pool: {again[:3]}"))
    if sum(r.requests for r in cluster.replicas) != len(rec.routes):
        problems.append((NO_REQUEST_DUPLICATED, "the replicas were sent more requests than the router routed"))
    for r in cluster.replicas:
        if r.engine.leaked_blocks:
            problems.append((NO_LEAK_ANYWHERE, f"{r.name} holds {r.engine.leaked_blocks} blocks with no request left"))
        try:
            r.engine.check()
        except AuditError as exc:
            problems.append((NO_LEAK_ANYWHERE, f"{r.name}: {exc}"))
        unanswered = r.in_prefill()
        if r.in_flight_requests or r.in_flight_tokens or unanswered.requests or unanswered.tokens:
            problems.append(
                (
                    NO_LEAK_ANYWHERE,
                    f"{r.name}: {r.in_flight_requests} requests ({r.in_flight_tokens} "
                    f"tokens) still in flight, {unanswered.requests} awaiting a first token",
                )
            )
        if r.cached_by_request:
            problems.append(
                (NO_LEAK_ANYWHERE, f"{r.name}: cache-hit notes of {len(r.cached_by_request)} requests left behind")
            )
        received = getattr(r.engine.executor, "received", None)  # a decode replica's (cluster/transfer.py)
        if received:
            problems.append((NO_LEAK_ANYWHERE, f"{r.name}: received-KV counts of {len(received)} requests left behind"))
    pools = {"mixed"} if not cluster.disaggregated else {"prefill", "decode"}
    for route in rec.routes:
        if route.pool not in pools or cluster.replicas[route.replica].role != route.pool:
            name = cluster.replicas[route.replica].name
            problems.append((ROUTES_IN_POOL, f"{route.request_id} routed to {name} in the {route.pool} pool"))
            break
    if cluster.disaggregated:
        decoded = {request_id for request_id, pool in routed if pool == "decode"}
        prefilled = {request_id for request_id, pool in routed if pool == "prefill"}
        if decoded - prefilled:
            problems.append((ROUTES_IN_POOL, f"decoded without a prefill: {sorted(decoded - prefilled)[:3]}"))
    for row in rec.named_rows():
        timeline = (row.arrival_time, row.first_scheduled_time, row.first_token_time, row.finish_time)
        times = [t for t in timeline if t is not None]
        if times != sorted(times):
            problems.append(
                (TIMELINES_IN_ORDER, f"{row.request_id}: arrival, first scheduled, first token, finish = {times}")
            )
            break
    return problems


def assert_cluster(cluster: Cluster, requests: list[Request]) -> None:
    """Raise ``InvariantViolation`` for the first broken fleet invariant."""
    problems = check_cluster(cluster, requests)
    if problems:
        raise InvariantViolation(*problems[0])
