"""The router conformance suite (``engine check --router NAME``): what any router must keep, whatever it decides.

On random fleets (1-4 replicas of ``vllm-v1``, prefix caching on or off, reports fresh or up to
0.2 s stale) and random streams of requests (some sharing prefixes, some too long to ever fit):

- ``routes-every-request``: the router answers for every request with one of the replicas it was
  given, without raising; the fleet then keeps its invariants (``testing/cluster.py``: none lost,
  none routed or served twice, every block freed, each timeline in order). A router that raises,
  returns None, a foreign or stale view or anything else is refused by the cluster as a
  ``RouterError`` naming it, and this check reports that refusal, never a crash;
- ``deterministic``: the same fleet and requests, routed again by a new instance, go the same way;
- ``respects-staleness``: a router that declares ``reads_reports_only`` (and so is routed ahead of
  the replicas, as far as the staleness allows) routes exactly as when each request is routed at its
  arrival: what it reads is no fresher than the reports it may see. A router that does not declare
  it reads fresh signals by design, and this check does not apply to it.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.errors import FlakyFailure

from kvsched.core.request import Request, SamplingParams
from kvsched.errors import PolicyError, shorten
from kvsched.testing.checks import (
    FAIL,
    NOT_CLAIMED,
    PASS,
    UNDECIDED,
    CheckResult,
    check_settings,
    counterexample,
    shrink_budget,
)
from kvsched.testing.invariants import InvariantViolation

ROUTES_EVERY_REQUEST = "routes-every-request"
DETERMINISTIC = "deterministic"
RESPECTS_STALENESS = "respects-staleness"

ROUTER_CHECKS = {
    ROUTES_EVERY_REQUEST: "every request is routed to one of the replicas the router was given, and the fleet loses, "
    "duplicates and leaks nothing; a router that raises or returns nonsense is refused by name",
    DETERMINISTIC: "the same fleet and requests are routed the same way by a new instance of the router",
    RESPECTS_STALENESS: "a router that reads only reports routes the same ahead of the replicas as at each arrival",
}
SETTINGS = {
    "num_gpu_blocks": 64,
    "block_size": 16,
    "max_num_batched_tokens": 1024,
    "max_model_len": 1024,
    "audit_every_step": True,
}


def fleet_scenarios() -> st.SearchStrategy[dict[str, Any]]:
    """A fleet's shape and a stream of requests, each ``(shared prefix length, output, gap, prefix family, own
    tokens)``: short enough to read in a counter-example (``requests`` makes them)."""
    return st.fixed_dictionaries(
        {
            "requests": st.lists(
                st.tuples(
                    st.integers(1, 700), st.integers(1, 60), st.floats(0, 0.3), st.integers(0, 3), st.integers(0, 40)
                ),
                min_size=1,
                max_size=30,
            ),
            "replicas": st.integers(1, 4),
            "caching": st.booleans(),
            "staleness": st.sampled_from((0.0, 0.01, 0.05, 0.2)),
        }
    )


def requests(scenario: dict[str, Any]) -> list[Request]:
    """The scenario's requests: prompts on a few shared prefixes (a session each) plus tokens of their own."""
    t, made = 0.0, []
    for i, (prompt, output, gap, family, extra) in enumerate(scenario["requests"]):
        t += gap
        own = 9_000_000 + 100 * i
        tokens = tuple(range(family * 10_000, family * 10_000 + prompt)) + tuple(range(own, own + extra))
        made.append(
            Request(
                request_id=f"r{i}",
                prompt_token_ids=tokens,
                output_len=output,
                arrival_time=round(t, 6),
                sampling=SamplingParams(max_tokens=64),
                session_id=f"s{family}",
            )
        )
    return made


def _fleet(router: Any, options: dict | None, scenario: dict[str, Any], lookahead: bool = True):
    """The scenario's fleet behind ``router``, run: the cluster (a ``PolicyError`` if the router misbehaved)."""
    from kvsched.cluster import Cluster, FleetSpec, ReplicaGroup

    settings = {**SETTINGS, "enable_prefix_caching": scenario["caching"]}
    group = ReplicaGroup(count=scenario["replicas"], policy="vllm-v1", settings=settings)
    spec = FleetSpec(replicas=[group], router=router, router_options=options or {}, staleness_s=scenario["staleness"])
    cluster = Cluster(spec, lookahead=lookahead)
    cluster.run(requests(scenario))
    return cluster


def _routed(router: Any, options: dict | None, scenario: dict[str, Any], lookahead: bool = True) -> tuple:
    """The routes a run made, each (request, pool, time, replica, reason); a refusal is this check's violation."""
    try:
        return tuple(_fleet(router, options, scenario, lookahead).records.routes)
    except PolicyError as exc:
        raise InvariantViolation(ROUTES_EVERY_REQUEST, f"refused: {shorten(str(exc), 400)}") from exc


def _run(check: str, test, examples: int, derandomize: bool) -> CheckResult:
    """One check over ``examples`` fleet scenarios: the first failing scenario, unshrunk (each runs a fleet)."""

    @settings(check_settings(examples, 1, derandomize, shrink=False))
    @given(scenario=fleet_scenarios())
    def conforms(scenario):
        test(scenario)

    try:
        with shrink_budget(None):
            conforms()
    except InvariantViolation as exc:
        broken = exc
    except Exception as exc:  # no verdict (say so in the table), unless it broke once and not when Hypothesis ran
        # the scenario again (FlakyFailure): still broken, as a router whose answers vary by run breaks determinism
        flaky = exc.exceptions if isinstance(exc, FlakyFailure) else ()
        broken = next((e for e in flaky if isinstance(e, InvariantViolation)), None)
        if broken is None:
            return CheckResult(check, UNDECIDED, f"the check stopped: {type(exc).__name__}: {shorten(str(exc))}")
    else:
        return CheckResult(check, PASS)
    return CheckResult(broken.invariant, FAIL, broken.detail, counterexample(broken))


def run_router_checks(
    router: Any, options: dict | None = None, examples: int = 20, derandomize: bool = True
) -> list[CheckResult]:
    """Every router check on ``router`` (an installed name, ``file.py:Class`` or a router object), one result each."""
    from kvsched.testing.cluster import check_cluster

    def routes_every_request(scenario):
        try:
            cluster = _fleet(router, options, scenario)
        except PolicyError as exc:
            raise InvariantViolation(ROUTES_EVERY_REQUEST, f"refused: {shorten(str(exc), 400)}") from exc
        problems = check_cluster(cluster, requests(scenario))
        if problems:
            raise InvariantViolation(ROUTES_EVERY_REQUEST, f"{problems[0][0]}: {problems[0][1]}")

    def deterministic(scenario):
        first, again = _routed(router, options, scenario), _routed(router, options, scenario)
        if first != again:
            at = next((i for i, (a, b) in enumerate(zip(first, again)) if a != b), min(len(first), len(again)))
            raise InvariantViolation(
                DETERMINISTIC,
                f"routed differently the second time, from route {at}: {first[at : at + 1]} then {again[at : at + 1]}",
            )

    def respects_staleness(scenario):
        ahead, at_arrival = _routed(router, options, scenario), _routed(router, options, scenario, lookahead=False)
        if ahead != at_arrival:
            raise InvariantViolation(
                RESPECTS_STALENESS,
                "routed ahead of the replicas it chose otherwise than at each "
                f"arrival (staleness {scenario['staleness']} s): it reads something fresher "
                "than the reports it declares",
            )

    results = [_run(ROUTES_EVERY_REQUEST, routes_every_request, examples, derandomize)]
    if results[0].failed:  # a router the cluster refuses cannot be judged on the rest
        first = f"{ROUTES_EVERY_REQUEST} failed first"
        return results + [CheckResult(name, UNDECIDED, first) for name in (DETERMINISTIC, RESPECTS_STALENESS)]
    results.append(_run(DETERMINISTIC, deterministic, examples, derandomize))
    if _reads_reports_only(router, options):
        results.append(_run(RESPECTS_STALENESS, respects_staleness, examples, derandomize))
    else:
        results.append(CheckResult(RESPECTS_STALENESS, NOT_CLAIMED, "it reads fresh signals (no reads_reports_only)"))
    return results


def _reads_reports_only(router: Any, options: dict | None) -> bool:
    from kvsched.cluster import Cluster, FleetSpec, ReplicaGroup

    spec = FleetSpec(replicas=[ReplicaGroup()], router=router, router_options=options or {})
    return Cluster(spec).router.reads_reports_only
