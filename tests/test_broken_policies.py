"""The suite and the engine catch each deliberately broken policy, with a clear message."""

from __future__ import annotations

import broken_policies as bp
import pytest

from kvsched import Engine, EngineConfig, SimulatedExecutor
from kvsched.core.request import Request, SamplingParams
from kvsched.errors import PolicyError
from kvsched.testing.checks import FAIL, PASS, check_machine, check_starvation


def small_run(policy, n=4):
    eng = Engine(EngineConfig(), policy, SimulatedExecutor())
    for i in range(n):
        eng.add_request(Request(request_id=f"r{i}", prompt_len=16, output_len=4, sampling=SamplingParams(max_tokens=4)))
    return eng


def test_engine_rejects_admitting_a_running_group_and_rolls_back():
    eng = small_run(bp.AdmitsRunning)
    eng.step()
    with pytest.raises(PolicyError, match=r"broken-admits-running.*admit: 'r0' is RUNNING, not WAITING"):
        eng.step()
    eng.check()  # the failed step left no trace in the allocator or the queues


def test_engine_wraps_an_exception_from_the_policy():
    with pytest.raises(PolicyError, match=r"broken-raises.*raised RuntimeError: queue too long"):
        small_run(bp.Raises).step()


@pytest.mark.parametrize(
    ("policy", "invariant", "message"),
    [
        (bp.AdmitsRunning, "valid-decisions", "is RUNNING, not WAITING"),
        (bp.Raises, "valid-decisions", "raised RuntimeError"),
        (bp.StarvesTenant, "finishes-within-bound", "no progress for"),
        (bp.PreemptsMostUrgent, "priority-preemption", "was preempted for the less urgent"),
    ],
)
def test_suite_reports_the_broken_invariant_with_a_counterexample(policy, invariant, message):
    (result,) = check_machine(policy, max_examples=400, steps=20, only={invariant}, shrink=False)
    assert result.status == FAIL and message in result.detail
    assert "state.start(config=EngineConfig(" in result.counterexample and "state.arrive(" in result.counterexample


def test_suite_still_judges_the_other_invariants_of_a_broken_policy():
    results = {r.invariant: r.status for r in check_machine(bp.Raises, max_examples=20, steps=10, shrink=False)}
    assert results["valid-decisions"] == FAIL
    assert results["no-leaked-blocks"] in (PASS, "undecided")


def test_starvation_claim_is_checked_under_continuous_arrivals():
    result = check_starvation(bp.StarvesTenant, max_examples=1)
    assert result.status == FAIL and "victim-bob had not finished" in result.detail
    assert "OverloadScenario(" in result.counterexample


def test_starvation_check_catches_sjf_without_its_guard():
    """Shortest-first alone starves long requests under a stream of short ones; the guard is what makes the claim true.
    (With the oracle's lengths: what sjf predicts by default, the history of finished answers, ranks no request
    apart.)"""
    assert check_starvation("sjf", {"starvation_s": "1e9", "predictor": "oracle"}, max_examples=1).status == FAIL
    assert check_starvation("sjf", {"predictor": "oracle"}, max_examples=1).status == PASS


def test_a_policy_that_raises_under_overload_fails_its_starvation_claim_with_the_scenario():
    """It used to escape the check as a bare PolicyError (one line, no table)."""
    result = check_starvation(bp.RaisesClaimingStarvationFree, max_examples=1)
    assert result.status == FAIL and "the policy failed in the overload scenario" in result.detail
    assert "raised RuntimeError: queue too long" in result.detail and "OverloadScenario(" in result.counterexample


def test_a_nan_chunk_is_a_failed_decision_not_a_crash_of_the_suite():
    (result,) = check_machine(bp.ChunksByNaN, max_examples=30, steps=6, only={"valid-decisions"}, shrink=False)
    assert result.status == FAIL and "max_tokens must be a positive integer or None, got nan" in result.detail


def test_budgets_are_judged_from_the_batch_not_from_the_counter_it_carries():
    """A step whose batch exceeds the budget fails budgets-respected even when its own counter says 0."""
    from helpers import unit_engine

    from kvsched.core.outputs import ScheduledGroup, SchedulerOutput
    from kvsched.core.report import StepReport
    from kvsched.core.view import OutputView, frozen
    from kvsched.testing.invariants import BUDGETS_RESPECTED, InvariantViolation
    from kvsched.testing.machine import PolicyMachine

    machine = PolicyMachine.for_policy("vllm-default")()
    machine.engine = engine = unit_engine(max_num_batched_tokens=16, max_num_seqs=4)
    machine.limits = frozen(engine.config)  # as start() takes them
    machine.watch = None
    group = engine.add_request(
        Request(request_id="big", prompt_len=40, output_len=2, sampling=SamplingParams(max_tokens=2))
    )
    output = SchedulerOutput(scheduled=[ScheduledGroup(group, 40, True)], num_batched_tokens=0)
    engine.step = lambda: StepReport(0, 1.0, 1.0, OutputView(output), (), 0, 1, 0, engine.cache)
    with pytest.raises(InvariantViolation, match="batched 40 tokens > max_num_batched_tokens 16") as caught:
        machine._step()
    assert caught.value.invariant == BUDGETS_RESPECTED


def test_a_capped_shrink_says_so_without_hypothesis_asking_for_a_bug_report(capsys):
    (result,) = check_machine(bp.AdmitsRunning, max_examples=30, steps=8, only={"valid-decisions"}, shrink_seconds=0)
    out = capsys.readouterr()
    assert result.status == FAIL and "state.start(" in result.counterexample
    assert "shrinking stopped after" in result.counterexample
    assert "five minutes" not in out.out + out.err and "PLEASE REPORT" not in out.out + out.err


def test_victim_churn_is_bounded_where_claimed_and_reported_where_not():
    """The starvation check passed a policy that preempted one request 13 times: churn is a claim of its own."""
    from kvsched.policies.vllm_v1 import VllmV1
    from kvsched.testing.checks import check_overload

    class NeverTwice(VllmV1):
        claims = frozenset({"starvation-free", "bounded-preemption"})
        max_preemptions_per_request = 0  # it preempts: the bound is broken at once

    starvation, churn = check_overload(NeverTwice, max_examples=1)
    assert (
        churn.status == FAIL
        and "more than its max_preemptions_per_request of 0" in churn.detail
        and "preempted" in churn.detail
    )
    assert starvation.status == "undecided" and "bounded-preemption failed first" in starvation.detail

    class Restates(VllmV1):
        claims = VllmV1.claims

    starvation, churn = check_overload(Restates, max_examples=1)
    assert starvation.status == PASS and churn.status == "not claimed" and "in its overload scenarios" in churn.detail

    class Unbounded(VllmV1):
        claims = frozenset({"bounded-preemption"})

    with pytest.raises(ValueError, match="max_preemptions_per_request, a whole number >= 0"):
        check_overload(Unbounded, max_examples=1)
