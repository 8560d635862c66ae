"""Run the whole conformance suite on one policy and report per invariant: the engine of ``engine check``.

The state machine checks every universal invariant at once. When one fails, the run is
repeated with that invariant switched off (examples that trip it are discarded), so that a
policy with one bug still gets a verdict on everything else. Claims run as their own checks.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from hypothesis.reporting import with_reporter
from hypothesis.stateful import run_state_machine_as_test

from kvsched.errors import shorten
from kvsched.testing import invariants as inv
from kvsched.testing.claims import (
    BOUNDED_PREEMPTION,
    CLAIMS,
    PRIORITY_PREEMPTION,
    STARVATION_FREE,
    declared_claims,
    preemption_bound,
)
from kvsched.testing.machine import PolicyMachine
from kvsched.testing.starvation import run_overload
from kvsched.testing.strategies import overload_scenarios

PASS, FAIL, NOT_CLAIMED, UNDECIDED = "pass", "FAIL", "not claimed", "undecided"


@dataclass(frozen=True)
class CheckResult:
    invariant: str
    status: str  # pass, FAIL, not claimed, undecided
    detail: str = ""  # the failure message
    counterexample: str = ""  # Hypothesis's shrunk reproduction

    @property
    def failed(self) -> bool:
        return self.status == FAIL


def check_settings(max_examples: int, steps: int, derandomize: bool, shrink: bool = True) -> settings:
    phases = tuple(Phase) if shrink else tuple(p for p in Phase if p is not Phase.shrink)
    return settings(
        max_examples=max_examples,
        phases=phases,
        stateful_step_count=steps,
        deadline=None,
        database=None,
        derandomize=derandomize,
        print_blob=False,
        report_multiple_bugs=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    )


def counterexample(exc: BaseException) -> str:
    """Hypothesis's reproduction, minus the invariant calls between steps and its coverage hints."""
    text = "\n".join(
        n for n in getattr(exc, "__notes__", []) if not n.startswith(("You can reproduce", "Explanation:"))
    )
    text = text.split("\n    These lines were always and only run")[0]
    return "\n".join(line for line in text.splitlines() if line.strip() != "state.allocator_consistent()").strip()


def _loaded(policy: Any) -> Any:
    """An installed policy's object from its name, so that its declared claims can be read."""
    if isinstance(policy, str):
        from kvsched.plugins.discovery import load_policy

        return load_policy(policy)
    return policy


@contextmanager
def shrink_budget(seconds: float | None):
    """Cap Hypothesis's shrinking time (its default is 300 s), so that a failing check answers quickly.

    Uses the engine's module constant, which Hypothesis reads when shrinking starts; if a future
    version drops it, shrinking simply keeps Hypothesis's own limit. Hypothesis's own messages
    are kept out of the output (its "more than five minutes ... PLEASE REPORT THIS" warning would
    be wrong about the time and the cause); the yielded list holds the notes of a capped shrink.
    """
    from hypothesis.internal.conjecture import engine

    old = getattr(engine, "MAX_SHRINKING_SECONDS", None)
    if seconds is not None and old is not None:
        engine.MAX_SHRINKING_SECONDS = seconds
    capped: list[str] = []

    def report(text) -> None:
        if "shrink" in str(text) and not capped:
            capped.append(
                f"(shrinking stopped after {seconds if seconds is not None else old:g} s: the counter-example may not "
                "be minimal)"
            )

    try:
        with with_reporter(report):
            yield capped
    finally:
        if old is not None:
            engine.MAX_SHRINKING_SECONDS = old


def check_machine(
    policy: Any,
    options: dict | None = None,
    max_examples: int = 40,
    steps: int = 30,
    derandomize: bool = True,
    only: set[str] | None = None,
    shrink: bool = True,
    shrink_seconds: float | None = None,
) -> list[CheckResult]:
    """The universal invariants (and priority-preemption if claimed), one result per invariant."""
    policy = _loaded(policy)
    names = list(inv.INVARIANTS) + ([PRIORITY_PREEMPTION] if PRIORITY_PREEMPTION in declared_claims(policy) else [])
    if only is not None:
        names = [n for n in names if n in only]
    results: dict[str, CheckResult] = {}
    skip: set[str] = set(inv.INVARIANTS) | {PRIORITY_PREEMPTION}
    skip -= set(names)
    while len(results) < len(names):
        machine = PolicyMachine.for_policy(policy, options, skip | set(results))
        try:
            with shrink_budget(shrink_seconds) as capped:
                run_state_machine_as_test(machine, settings=check_settings(max_examples, steps, derandomize, shrink))
        except inv.InvariantViolation as exc:
            results[exc.invariant] = CheckResult(
                exc.invariant, FAIL, exc.detail, "\n".join([counterexample(exc), *capped]).strip()
            )
            continue
        except Unsatisfiable as exc:
            for name in names:
                results.setdefault(
                    name, CheckResult(name, UNDECIDED, f"every example tripped an earlier failure ({exc})")
                )
            break
        except Exception as exc:  # the suite itself could not run to a verdict: say so in the table
            for name in names:
                results.setdefault(
                    name, CheckResult(name, UNDECIDED, f"the check stopped: {type(exc).__name__}: {shorten(str(exc))}")
                )
            break
        for name in names:
            results.setdefault(name, CheckResult(name, PASS))
    return [results[n] for n in names]


def check_starvation(
    policy: Any, options: dict | None = None, max_examples: int = 4, derandomize: bool = True
) -> CheckResult:
    """``starvation-free``: the victims of an overload scenario finish before the stream ends."""
    return check_overload(policy, options, max_examples, derandomize)[0]


def check_overload(
    policy: Any, options: dict | None = None, max_examples: int = 4, derandomize: bool = True
) -> tuple[CheckResult, CheckResult]:
    """The overload scenarios' claims: ``starvation-free`` (the victims finish before the stream ends) and
    ``bounded-preemption`` (no request preempted more than ``max_preemptions_per_request`` times). Where only the
    first is claimed, the second's row says how often the most preempted request was (victim churn the
    starvation check alone would pass)."""
    policy = _loaded(policy)
    claimed = declared_claims(policy)
    bound = preemption_bound(policy) if BOUNDED_PREEMPTION in claimed else None
    if not claimed & {STARVATION_FREE, BOUNDED_PREEMPTION}:
        return CheckResult(STARVATION_FREE, NOT_CLAIMED), CheckResult(BOUNDED_PREEMPTION, NOT_CLAIMED)
    worst = []  # the most preempted request of each scenario

    # Each example simulates a minute of overload: report the first failing scenario unshrunk.
    @settings(check_settings(max_examples, 1, derandomize, shrink=False))
    @given(scenario=overload_scenarios())
    def overloaded(scenario):
        try:
            result = run_overload(policy, scenario, options)
        except Exception as exc:  # a policy that fails under overload does not keep its claims
            raise inv.InvariantViolation(
                min(claimed & {STARVATION_FREE, BOUNDED_PREEMPTION}),
                f"the policy failed in the overload scenario: {shorten(str(exc), 300)}",
            ) from exc
        worst.append(result.churn)
        if STARVATION_FREE in claimed and result.starved:
            raise inv.InvariantViolation(
                STARVATION_FREE,
                f"{', '.join(result.starved_ids)} had not finished after {result.horizon_s:.0f} "
                f"simulated seconds of overload, while {result.stream_served} favoured requests were served",
            )
        if bound is not None and result.churn.preemptions > bound:
            raise inv.InvariantViolation(
                BOUNDED_PREEMPTION, f"{result.churn}, more than its max_preemptions_per_request of {bound}"
            )

    failed = None
    try:
        with shrink_budget(None):
            overloaded()
    except inv.InvariantViolation as exc:
        failed = CheckResult(exc.invariant, FAIL, exc.detail, counterexample(exc))
    results = {}
    for claim in (STARVATION_FREE, BOUNDED_PREEMPTION):
        if failed is not None and failed.invariant == claim:
            results[claim] = failed
        elif claim not in claimed:
            most = max(worst, key=lambda c: c.preemptions, default=None)
            seen = f"in its overload scenarios {most}" if most is not None else ""
            results[claim] = CheckResult(claim, NOT_CLAIMED, seen if claim == BOUNDED_PREEMPTION else "")
        else:
            results[claim] = (
                CheckResult(claim, UNDECIDED, f"{failed.invariant} failed first")
                if failed
                else CheckResult(claim, PASS)
            )
    return results[STARVATION_FREE], results[BOUNDED_PREEMPTION]


def run_checks(
    policy: Any,
    options: dict | None = None,
    max_examples: int = 40,
    steps: int = 30,
    starvation_examples: int = 4,
    derandomize: bool = True,
    shrink: bool = True,
    shrink_seconds: float | None = None,
) -> list[CheckResult]:
    """Every invariant, then every claim (``not claimed`` rows for claims the policy does not make)."""
    policy = _loaded(policy)
    results = check_machine(
        policy, options, max_examples, steps, derandomize, shrink=shrink, shrink_seconds=shrink_seconds
    )
    results += check_overload(policy, options, starvation_examples, derandomize)
    if PRIORITY_PREEMPTION not in declared_claims(policy):
        results.append(CheckResult(PRIORITY_PREEMPTION, NOT_CLAIMED))
    order = list(inv.INVARIANTS) + list(CLAIMS)
    return sorted(results, key=lambda r: order.index(r.invariant))
