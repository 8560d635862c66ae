"""Steady steps change how often the policy is called, never what the engine computes.

A policy may declare ``fcfs`` (it offers waiting groups in queue order, stopping at the first that does not fit,
and reads nothing but the queues and the core's answers): the core then repeats a step that decoded every running
group in the lane, with nothing waiting or only the head refused for want of blocks, without calling
``select_batch``, for as long as it can prove each call would give the same outcome. The main property: for random
workloads, configs, policies (every built-in one and adversarial ones below) and aborts, an engine that repeats
steady steps and one that calls the policy every step produce the same steps (batch, notes, preemptions, block
movements and tables, features, durations, finishes, queues) and the same requests, every step audited.
"""

from __future__ import annotations

import pytest
from helpers import CountingPolicy, engine_configs, req
from hypothesis import given, note
from hypothesis import strategies as st

from kvsched import Engine, EngineConfig
from kvsched.allocators.alloc_status import AllocStatus
from kvsched.core.decisions import Decision, Outcome
from kvsched.core.hookspecs import hookimpl
from kvsched.core.request import Request, SamplingParams
from kvsched.errors import PolicyError
from kvsched.executors.simulated import SimulatedExecutor
from kvsched.policies.continuous import ContinuousBatching

STOP = (Outcome.LATER, Outcome.BUDGET)


def _swapped_in(step) -> bool:
    """Swap groups back in, oldest first; True if none is left out."""
    for group in step.swapped:
        if step.swap_in(group) in STOP:
            return False
    return True


def _admit_in_order(step) -> None:
    for group in step.waiting:
        if step.admit(group) in STOP:
            return


class CappedDecodesFirst:
    """FCFS (declared) after decoding through advance_decodes under a cap: the lane called with a cap, passing over
    prefills, and a refusal noted after the lane call."""

    name = "capped-decodes-first"
    fcfs = True

    @hookimpl
    def select_batch(self, step):
        step.advance_decodes(max_tokens=6)
        if step.num_preempted or not _swapped_in(step):
            return
        _admit_in_order(step)


class HoldsBackWhileBusy:
    """FCFS (declared) only while fewer than three groups run, else holding back with the count: a reason of the
    policy's own, which the core cannot prove again, so such a step is never repeated."""

    name = "holds-back-while-busy"
    fcfs = True

    @hookimpl
    def select_batch(self, step):
        step.advance_running()
        if step.num_preempted or not _swapped_in(step):
            return
        if len(step.running) >= 3:
            step.hold_back("busy", running=len(step.running))
            return
        _admit_in_order(step)


class OwnAdmissionRule:
    """fcfs with its own can_allocate (prompts over 40 tokens wait while others run and fewer than 60 blocks are free):
    refusals by a policy's rule are not the core's to prove, so these steps are never repeated."""

    name = "own-admission-rule"
    fcfs = True

    @hookimpl
    def select_batch(self, step):
        step.advance_running(stop_on_preempted=False)
        if step.num_preempted or not _swapped_in(step):
            return
        _admit_in_order(step)

    @hookimpl
    def can_allocate(self, step, group):
        if group.prompt_len > 40 and step.running and step.cache.num_free_gpu_blocks < 60:
            return AllocStatus.LATER
        return None


POLICIES = [
    "vllm-default",
    "vllm-v1",
    "fcfs",
    "sarathi",
    "sjf",
    "vtc",
    "lpm",
    "priority-vip",
    CappedDecodesFirst,
    HoldsBackWhileBusy,
    OwnAdmissionRule,
]

configs = engine_configs(
    max_model_len=st.sampled_from([None, 48, 80]),
    delay_factor=st.sampled_from([0.0, 0.5]),
    vllm_engine=st.sampled_from(["v0", "v0", "v1"]),
    num_gpu_blocks=st.integers(8, 160),
)
requests = st.lists(
    st.tuples(
        st.integers(1, 60),
        st.integers(1, 120),
        st.sampled_from([1, 1, 1, 2]),
        st.floats(0, 3, allow_nan=False),
        st.integers(0, 8),
        st.sampled_from([(), (-5,)]),
    ),
    min_size=1,
    max_size=24,
)


# Under KV pressure: the head of the queue refused for want of blocks while the rest decode, then blocks freed.
pressure_configs = engine_configs(
    num_gpu_blocks=st.integers(8, 64),
    max_num_seqs=st.integers(4, 32),
    delay_factor=st.just(0.0),
    vllm_engine=st.just("v0"),
    max_model_len=st.just(None),
)
pressure_requests = st.lists(
    st.tuples(
        st.integers(1, 60),
        st.integers(20, 120),
        st.sampled_from([1, 1, 1, 1, 2]),
        st.floats(0, 1, allow_nan=False),
        st.integers(0, 8),
        st.sampled_from([(), (), (-5,)]),
    ),
    min_size=4,
    max_size=24,
)
STEADY = ["vllm-default", "fcfs", CappedDecodesFirst, HoldsBackWhileBusy]


def _request(i, prompt, output, n, arrival, extra, stops) -> Request:
    return Request(
        request_id=f"r{i}",
        prompt_len=prompt,
        output_len=output,
        arrival_time=round(arrival, 3),
        tenant=f"t{i % 2}",
        sampling=SamplingParams(n=n, max_tokens=output + extra, stop_token_ids=stops),
    )


def _trace(policy, config, reqs, aborts, abort_step, steady):
    """Everything observable of a run, step by step, then request by request."""
    engine = Engine(EngineConfig(**config, audit_every_step=True), policy, SimulatedExecutor(steady_steps=steady))
    bm, steps = engine.scheduler.block_manager, []

    def record(report):
        steps.append(
            (
                *observed(report),
                {sid: tuple(t) for sid, t in bm.gpu_tables.items()},
                {sid: tuple(t) for sid, t in bm.cpu_tables.items()},
            )
        )
        if report.step == abort_step:
            for i in aborts:
                engine.abort(f"r{i}")

    engine.run(reqs, on_step=record)
    return steps, finals(engine)


def observed(report) -> tuple:
    """What a step's report says: batch, notes, preemptions, block movements, features, duration, finishes, queues."""
    out = report.output
    return (
        report.step,
        report.now,
        report.duration,
        report.features,
        out.lane_decodes,
        out.num_batched_tokens,
        [(s.group.request_id, s.num_tokens, s.is_prefill, s.num_cached_tokens) for s in out.scheduled],
        [(g.request_id, mode.value) for g, mode in out.preempted],
        [g.request_id for g in out.ignored],
        out.blocks_to_swap_in,
        out.blocks_to_swap_out,
        out.blocks_to_copy,
        out.decisions,
        [g.request_id for g in report.finished],
        report.num_waiting,
        report.num_running,
        report.num_swapped,
        report.cache.num_free_gpu_blocks,
        report.cache.num_free_cpu_blocks,
    )


def finals(engine) -> dict:
    """Every request as it ended (and no block leaked)."""
    assert engine.leaked_blocks == 0
    return {
        g.request_id: (
            g.status,
            g.finish_detail,
            g.first_scheduled_time,
            g.first_token_time,
            g.finish_time,
            g.num_generated_tokens,
            [list(s.output) for s in g.seqs],
            g.num_recompute_preemptions,
            g.num_swap_preemptions,
        )
        for g in engine._groups.values()
    }


def fitted(policy, config: dict) -> dict:
    """``config`` with V1 mechanics for vllm-v1."""
    if (
        policy == "vllm-v1"
    ):  # V1 has no swap: on v0 mechanics with preemption_mode=swap its swapped groups stay there (a stall)
        config = {**config, "vllm_engine": "v1"}
    return config


@given(
    policy=st.sampled_from(POLICIES),
    config=configs,
    spec=requests,
    aborts=st.lists(st.integers(0, 15), max_size=3),
    abort_step=st.integers(0, 60),
)
def test_repeating_steady_steps_changes_nothing_observable(policy, config, spec, aborts, abort_step):
    config = fitted(policy, config)
    reqs = [_request(i, *row) for i, row in enumerate(spec)]
    repeated = _trace(policy, config, reqs, aborts, abort_step, steady=True)
    called = _trace(policy, config, reqs, aborts, abort_step, steady=False)
    note(f"{len(repeated[0])} steps")
    assert repeated[0] == called[0]
    assert repeated[1] == called[1]


@given(
    policy=st.sampled_from(STEADY),
    config=pressure_configs,
    spec=pressure_requests,
    aborts=st.lists(st.integers(0, 23), max_size=2),
    abort_step=st.integers(0, 200),
)
def test_repeating_steady_steps_under_kv_pressure_changes_nothing_observable(policy, config, spec, aborts, abort_step):
    test_repeating_steady_steps_changes_nothing_observable.hypothesis.inner_test(
        policy, config, spec, aborts, abort_step
    )


def _calls(steady: bool, reqs, **config) -> int:
    engine = Engine(EngineConfig(block_size=4, **config), CountingPolicy, SimulatedExecutor(steady_steps=steady))
    engine.run(reqs)
    return engine.hooks.policy.calls, engine.num_steps


def test_steady_steps_are_repeated_without_the_policy():
    """Under KV pressure (the head of the queue refused for want of blocks) and at low load (nothing waiting)."""
    pressure = [req(f"r{i}", 40, 60 + 7 * i, arrival=0.01 * i) for i in range(30)]
    calls, steps = _calls(True, pressure, num_gpu_blocks=200)
    assert _calls(False, pressure, num_gpu_blocks=200) == (steps, steps)
    assert calls < steps // 2
    sparse = [req(f"r{i}", 10, 50, arrival=2.0 * i) for i in range(5)]
    calls, steps = _calls(True, sparse, num_gpu_blocks=200)
    assert calls < steps // 4


def test_fcfs_is_declared_by_the_policies_that_admit_in_queue_order():
    """vllm-default and fcfs declare it (and a policy with no select_batch of its own, built by vllm-default's);
    a continuous-batching policy that orders its own queue does not, whatever it inherits."""
    names = ("vllm-default", "fcfs", "sjf", "lpm", "vllm-v1")
    declared = {name: Engine(EngineConfig(), name, SimulatedExecutor()).hooks.fcfs for name in names}
    assert declared == {"vllm-default": True, "fcfs": True, "sjf": False, "lpm": False, "vllm-v1": False}

    class Reordered(ContinuousBatching):
        name = "reordered"

        def order_waiting(self, step):
            return reversed(step.waiting)

    class OnlyPicksVictims:
        name = "only-picks-victims"

        @hookimpl
        def choose_preemption(self, step, requester):
            return None

    assert not Engine(EngineConfig(), Reordered, SimulatedExecutor()).hooks.fcfs
    assert Engine(EngineConfig(), OnlyPicksVictims, SimulatedExecutor()).hooks.fcfs


def test_a_policys_own_reason_makes_a_step_unrepeatable():
    """holds-back-while-busy counts the running groups in its note: it is called again at every step it holds."""
    reqs = [req(f"r{i}", 10, 20 + 9 * i) for i in range(5)]
    engine = Engine(EngineConfig(block_size=4, num_gpu_blocks=200), CountingHolds, SimulatedExecutor())
    reports = []
    engine.run(reqs, on_step=reports.append)
    held = [r for r in reports if r.output.decisions and r.output.decisions[0][2] == "busy"]
    counts = [r.output.decisions[0][3]["running"] for r in held]
    assert counts == sorted(counts, reverse=True) and len(set(counts)) > 1
    calls = engine.hooks.policy.calls
    assert {r.started for r in held} <= set(calls) and len(calls) < engine.num_steps


class CountingHolds(HoldsBackWhileBusy):
    """Holding back while busy, noting when it was called."""

    def __init__(self) -> None:
        self.calls = []

    @hookimpl
    def select_batch(self, step):
        self.calls.append(step.now)
        return super().select_batch(step)


class AdmitsBeforeDecoding:
    """FCFS (declared), offering the waiting groups before advancing the running ones (a refusal noted before the
    lane call, the free blocks it saw then taken by the decodes after it); counts its calls."""

    name = "admits-before-decoding"
    fcfs = True

    def __init__(self) -> None:
        self.calls = 0

    @hookimpl
    def select_batch(self, step):
        self.calls += 1
        _admit_in_order(step)
        step.advance_running()


def test_a_step_whose_one_note_is_not_a_refusal_for_blocks_is_not_repeated():
    """The head (two sequences), refused for want of blocks, is refused two seats once ``a`` finishes (SEQ_BUDGET);
    ``b``'s decode then takes a block, so the head is short of the blocks it lacked again. That step is not the
    core's to prove again: the policy is called for the next one, which refuses the head for blocks."""
    engine = Engine(
        EngineConfig(block_size=16, num_gpu_blocks=6, max_num_seqs=2, audit_every_step=True),
        AdmitsBeforeDecoding,
        SimulatedExecutor(),
    )
    for r in (req("a", 16, 2), req("b", 15, 200), req("c", 80, 5, n=2)):
        engine.add_request(r)
    kinds = [[note[0] for note in engine.step().output.decisions][-1:] for _ in range(4)]
    assert kinds == [[Decision.NO_BLOCKS], [Decision.NO_BLOCKS], [Decision.SEQ_BUDGET], [Decision.NO_BLOCKS]]
    assert engine.hooks.policy.calls == 4  # without the kind check, the fourth step replays the third's note


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_fcfs_is_true_or_false(value):
    class Bad(CappedDecodesFirst):
        name = "bad-fcfs"
        fcfs = value

    with pytest.raises(PolicyError, match=r"policy 'bad-fcfs': its fcfs is .*, not True or False"):
        Engine(EngineConfig(), Bad, SimulatedExecutor())
