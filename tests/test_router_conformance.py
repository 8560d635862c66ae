"""The router conformance suite (testing/routers.py, ``engine check --router``): the built-in routers keep it;
a router that raises, returns nonsense, is not deterministic or reads fresher than it declares fails it, by name."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from kvsched.routers.hookspecs import hookimpl
from kvsched.testing.checks import FAIL, NOT_CLAIMED, PASS, UNDECIDED
from kvsched.testing.routers import DETERMINISTIC, RESPECTS_STALENESS, ROUTES_EVERY_REQUEST, run_router_checks

ENGINE = str(Path(sys.executable).parent / "engine")


def verdicts(router, examples: int = 6) -> dict[str, str]:
    return {r.invariant: r.status for r in run_router_checks(router, examples=examples)}


@pytest.mark.parametrize("router", ["round-robin", "vllm-dp", "prefix-affinity", "power-of-two"])
def test_built_in_routers_conform(router):
    got = verdicts(router)
    assert got[ROUTES_EVERY_REQUEST] == got[DETERMINISTIC] == PASS
    assert got[RESPECTS_STALENESS] == (
        PASS if router in ("round-robin", "vllm-dp") else NOT_CLAIMED
    )  # those read reports only


class Raises:
    @hookimpl
    def route_request(self, request, replicas):
        raise RuntimeError("boom")


class Nonsense:
    @hookimpl
    def route_request(self, request, replicas):
        return "replica-0"


class Moody:
    """Routes at random, unseeded: no run is like the last."""

    def __init__(self) -> None:
        self.rng = random.Random()

    @hookimpl
    def route_request(self, request, replicas):
        return self.rng.choice(replicas)


class Peeks:
    """Declares it reads only reports, and reaches past its views (up its callers' frames, to the cluster loop's
    ``self``) for each replica's live queue: news no report carries yet. (Not through the collector's lists: the
    loop freezes the heap it starts with, as ``Engine.run`` does, and ``gc.get_objects`` leaves frozen objects out.)"""

    reads_reports_only = True

    def __init__(self) -> None:
        self.replicas = None

    @hookimpl
    def route_request(self, request, replicas):
        import sys

        if self.replicas is None:  # its own fleet: the Cluster whose loop called it
            frame = sys._getframe(1)
            while type(frame.f_locals.get("self")).__name__ != "Cluster":
                frame = frame.f_back
            self.replicas = frame.f_locals["self"].replicas
        loads = [len(r.engine._groups) for r in self.replicas]
        return replicas[loads.index(min(loads))]


def test_a_router_that_raises_or_returns_nonsense_is_refused_by_name():
    for router, why in ((Raises, "boom"), (Nonsense, "returned 'replica-0', not one of the ReplicaViews")):
        results = run_router_checks(router, examples=3)
        first = results[0]
        assert (
            first.invariant == ROUTES_EVERY_REQUEST
            and first.status == FAIL
            and why in first.detail
            and "refused" in first.detail
        )
        assert "scenario=" in first.counterexample  # the fleet and requests that showed it
        assert [r.status for r in results[1:]] == [UNDECIDED, UNDECIDED]


def test_a_router_that_routes_differently_each_time_is_not_deterministic():
    got = verdicts(Moody, examples=10)
    assert got[ROUTES_EVERY_REQUEST] == PASS and got[DETERMINISTIC] == FAIL


def test_a_check_that_breaks_once_and_holds_when_hypothesis_runs_it_again_is_failed():
    """Hypothesis runs a failing scenario again before it reports it; a router that broke the invariant the first
    time only (Moody, by chance: one run in three) left the check undecided (FlakyFailure), not failed."""
    from kvsched.testing.invariants import InvariantViolation
    from kvsched.testing.routers import _run

    calls = []

    def once(scenario):
        calls.append(scenario)
        if len(calls) == 1:
            raise InvariantViolation(DETERMINISTIC, "routed differently the second time")

    result = _run(DETERMINISTIC, once, examples=3, derandomize=True)
    assert len(calls) >= 2 and (result.invariant, result.status) == (DETERMINISTIC, FAIL)
    assert result.detail == "routed differently the second time"


def test_a_router_that_reads_fresher_than_it_declares_fails_the_staleness_check():
    got = verdicts(Peeks, examples=10)
    assert got[DETERMINISTIC] == PASS and got[RESPECTS_STALENESS] == FAIL


def test_engine_check_router_from_the_command_line(tmp_path):
    done = subprocess.run(
        [ENGINE, "check", "--router", "round-robin", "--examples", "3", "-q"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert (
        "router conformance of round-robin" in done.stdout
        and "routes-every-request" in done.stdout
        and "FAIL" not in done.stdout
    )
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from kvsched.routers.hookspecs import hookimpl\n\n\nclass Bad:\n    @hookimpl\n"
        "    def route_request(self, request, replicas):\n        return None\n"
    )
    failed = subprocess.run(
        [ENGINE, "check", "--router", f"{bad}:Bad", "--examples", "3", "-q"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (
        failed.returncode == 1 and "returned None" in failed.stdout and "Traceback" not in failed.stdout + failed.stderr
    )
    for args, message in (
        (["check"], "give --policy NAME"),
        (["check", "--router", "round-robin", "--steps", "5"], "--steps"),
        (["check", "--policy", "fcfs", "--router-opt", "x=1"], "--router-opt is the option of a router"),
        (["check", "--router", "no-such-router"], "unknown router"),
    ):
        done = subprocess.run([ENGINE, *args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1, (
            args,
            done.stderr,
        )


def test_a_router_sees_the_cap_not_the_answer_s_length():
    """A router's RequestView showed every field of the request, output_len too: a router knew the future."""
    from kvsched.cluster import Cluster, FleetSpec, ReplicaGroup
    from kvsched.core.request import Request, SamplingParams

    seen = []

    class Curious:
        @hookimpl
        def route_request(self, request, replicas):
            seen.append((hasattr(request, "output_len"), request.sampling.max_tokens, request.prompt_len))
            return replicas[0]

    Cluster(FleetSpec(replicas=[ReplicaGroup(count=2)], router=Curious)).run(
        [Request(request_id="a", prompt_len=9, output_len=3, sampling=SamplingParams(max_tokens=50))]
    )
    assert seen == [(False, 50, 9)]
