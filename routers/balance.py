"""Load-balancing routers: round-robin, least-outstanding, power-of-two-choices and vLLM's DP balancer.

They read no cache: only the replicas' load, as the router knows it (its own in-flight counts,
fresh) or as the replicas report it (waiting and running counts, ``staleness`` old).
"""

from __future__ import annotations

import random

from kvsched.routers import options
from kvsched.routers.choice import lowest, two_choices
from kvsched.routers.hookspecs import hookimpl
from kvsched.routers.view import Route


class RoundRobin:
    """Each replica in turn, whatever its load (Kubernetes' default Service routing)."""

    name = "round-robin"
    reads_reports_only = True  # it reads nothing at all

    def __init__(self) -> None:
        self.next = 0

    @hookimpl
    def route_request(self, request, replicas):
        choice = replicas[self.next % len(replicas)]
        self.next += 1
        return choice


class LeastOutstanding:
    """The replica with the fewest requests in flight (the router's own count), ties at random (``seed``)."""

    name = "least-outstanding"

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(options.seed(seed))

    @hookimpl
    def route_request(self, request, replicas):
        loads = [r.in_flight_requests for r in replicas]
        i = lowest(loads, self.rng)
        return Route(replicas[i], f"fewest in flight: {loads[i]}")


class PowerOfTwo:
    """Two replicas drawn at random, the one with fewer requests in flight (Ray Serve's default router)."""

    name = "power-of-two"

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(options.seed(seed))

    @hookimpl
    def route_request(self, request, replicas):
        if len(replicas) == 1:
            return replicas[0]
        i, a, b = two_choices(len(replicas), lambda k: replicas[k].in_flight_requests, self.rng)
        first, second = replicas[a], replicas[b]
        return Route(
            replicas[i],
            f"of {first.name} ({first.in_flight_requests} in flight) and {second.name} ({second.in_flight_requests})",
        )


class VllmDp:
    """vLLM's data-parallel balancer: the least waiting × 4 + running, as reported.

    As ``DPLBAsyncMPClient`` does, the requests it sent since a replica's report count as waiting
    there until the next report (vLLM's local increment between coordinator updates)."""

    name = "vllm-dp"
    reads_reports_only = True

    def __init__(self) -> None:
        self.sent: dict[str, tuple[float, int]] = {}  # replica -> (report time, requests sent since)

    @hookimpl
    def route_request(self, request, replicas):
        best, best_score, sent = None, None, self.sent
        for r in replicas:
            report = r.report  # one read for the three fields (this loop runs for every replica of every request)
            waiting = report.num_waiting
            seen = sent.get(r.name)
            if seen is not None and seen[0] == report.time:
                waiting += seen[1]
            score = waiting * 4 + report.num_running
            if best_score is None or score < best_score:
                best, best_score, best_seen, reported = r, score, seen, report.time
        sent[best.name] = (reported, (best_seen[1] if best_seen is not None and best_seen[0] == reported else 0) + 1)
        return Route(best, f"least waiting×4+running: {best_score}")
