"""Steady steps change how often the policy is called, never what the engine computes.

A policy may declare a step steady (``step.steady``): until an event it would build that step
again. The core then repeats it without calling ``select_batch`` for as long as it can prove each
call would give the same outcome. The main property: for random workloads, configs, policies
(every built-in one and adversarial ones below) and aborts, an engine that repeats steady steps
and one that calls the policy every step produce the same steps (batch, notes, preemptions, block
movements and tables, features, durations, finishes, queues) and the same requests, every step audited.
"""

from __future__ import annotations

import pytest
from helpers import CountingPolicy, engine_configs, req
from hypothesis import given, note
from hypothesis import strategies as st

from kvsched import Engine, EngineConfig
from kvsched.allocators.alloc_status import AllocStatus
from kvsched.core.decisions import Outcome
from kvsched.core.errors import PolicyError
from kvsched.core.hookspecs import hookimpl
from kvsched.core.request import Request, SamplingParams
from kvsched.executors.simulated import SimulatedExecutor
from kvsched.policies.vllm_default import VllmDefault

STOP = (Outcome.LATER, Outcome.BUDGET)


def _swapped_in(step) -> bool:
    """Swap groups back in, oldest first; True if none is left out."""
    for group in step.swapped:
        if step.swap_in(group) in STOP:
            return False
    return True


class SteadyEverywhere(VllmDefault):
    """vllm-default declaring every step steady until any arrival or finish (true without the delay
    gate): the core must not repeat its prefills, preemptions, swaps and budget stops."""

    name = "steady-everywhere"

    @hookimpl
    def select_batch(self, step):
        super().select_batch(step)
        step.steady()


class HoldsBackWhileBusy:
    """Admits FCFS only while fewer than three groups run, else holds back with the count (a note
    repeated verbatim): a finish changes that count, so finishes are events for it."""

    name = "holds-back-while-busy"

    @hookimpl
    def select_batch(self, step):
        step.advance_running()
        if step.num_preempted or not _swapped_in(step):
            return
        if len(step.running) >= 3:
            step.hold_back("busy", running=len(step.running))
            step.steady(arrivals=False)
            return
        for group in step.waiting:
            if step.admit(group) in STOP:
                step.steady(arrivals=False)
                return
        step.steady()


class TriesTwoAfterCappedDecodes:
    """Decodes through advance_decodes under a cap, then offers the first two waiting groups even when
    the first is refused: refusals after the lane, two at a time."""

    name = "tries-two-after-capped-decodes"

    @hookimpl
    def select_batch(self, step):
        step.advance_decodes(max_tokens=6)
        if step.num_preempted or not _swapped_in(step):
            return
        waiting = step.waiting
        for group in waiting[:2]:
            step.admit(group)
        step.steady(arrivals=len(waiting) < 2, finishes=False)


class OwnAdmissionRule:
    """fcfs with its own can_allocate (prompts over 40 tokens wait while others run and fewer than 60 blocks are free):
    refusals by a policy's rule are not the core's to prove, so these steps are never repeated."""

    name = "own-admission-rule"

    @hookimpl
    def select_batch(self, step):
        step.advance_running(stop_on_preempted=False)
        if step.num_preempted or not _swapped_in(step):
            return
        for group in step.waiting:
            if step.admit(group) in STOP:
                break
        step.steady(finishes=False)

    @hookimpl
    def can_allocate(self, step, group):
        if group.prompt_len > 40 and step.running and step.cache.num_free_gpu_blocks < 60:
            return AllocStatus.LATER
        return None


POLICIES = ["vllm-default", "vllm-v1", "fcfs", "sarathi", "sjf", "vtc", "lpm", "priority-vip",
            SteadyEverywhere, HoldsBackWhileBusy, TriesTwoAfterCappedDecodes, OwnAdmissionRule]
# SteadyEverywhere's declaration is true only without the delay gate, which reads the clock.
GATED = {"vllm-default", "vllm-v1", "fcfs", "sarathi", "sjf", "vtc", "lpm", "priority-vip"}

configs = engine_configs(max_model_len=st.sampled_from([None, 48, 80]), delay_factor=st.sampled_from([0.0, 0.5]),
                         vllm_engine=st.sampled_from(["v0", "v0", "v1"]), num_gpu_blocks=st.integers(8, 160))
requests = st.lists(
    st.tuples(st.integers(1, 60), st.integers(1, 120), st.sampled_from([1, 1, 1, 2]), st.floats(0, 3, allow_nan=False),
              st.integers(0, 8), st.sampled_from([(), (-5,)])),
    min_size=1, max_size=24,
)


# Under KV pressure: the head of the queue refused for want of blocks while the rest decode, then blocks freed.
pressure_configs = engine_configs(num_gpu_blocks=st.integers(8, 64), max_num_seqs=st.integers(4, 32), delay_factor=st.just(0.0),
                                  vllm_engine=st.just("v0"), max_model_len=st.just(None))
pressure_requests = st.lists(
    st.tuples(st.integers(1, 60), st.integers(20, 120), st.sampled_from([1, 1, 1, 1, 2]), st.floats(0, 1, allow_nan=False),
              st.integers(0, 8), st.sampled_from([(), (), (-5,)])),
    min_size=4, max_size=24,
)
STEADY = ["vllm-default", "fcfs", SteadyEverywhere, HoldsBackWhileBusy, TriesTwoAfterCappedDecodes]


def _request(i, prompt, output, n, arrival, extra, stops) -> Request:
    return Request(request_id=f"r{i}", prompt_len=prompt, output_len=output, arrival_time=round(arrival, 3), tenant=f"t{i % 2}",
                   sampling=SamplingParams(n=n, max_tokens=output + extra, stop_token_ids=stops))


def _trace(policy, config, reqs, aborts, abort_step, steady):
    """Everything observable of a run, step by step, then request by request."""
    engine = Engine(EngineConfig(**config, audit_every_step=True), policy, SimulatedExecutor(), steady_steps=steady)
    bm, steps = engine.scheduler.block_manager, []

    def record(report):
        steps.append((*observed(report), {sid: tuple(t) for sid, t in bm.gpu_tables.items()},
                      {sid: tuple(t) for sid, t in bm.cpu_tables.items()}))
        if report.step == abort_step:
            for i in aborts:
                engine.abort(f"r{i}")

    engine.run(reqs, on_step=record)
    return steps, finals(engine)


def observed(report) -> tuple:
    """What a step's report says: batch, notes, preemptions, block movements, features, duration, finishes, queues."""
    out = report.output
    return (
        report.step, report.now, report.duration, report.features, out.lane_decodes, out.num_batched_tokens,
        [(s.group.request_id, s.num_tokens, s.is_prefill, s.num_cached_tokens) for s in out.scheduled],
        [(g.request_id, mode.value) for g, mode in out.preempted], [g.request_id for g in out.ignored],
        out.blocks_to_swap_in, out.blocks_to_swap_out, out.blocks_to_copy, out.decisions,
        [g.request_id for g in report.finished], report.num_waiting, report.num_running, report.num_swapped,
        report.cache.num_free_gpu_blocks, report.cache.num_free_cpu_blocks,
    )


def finals(engine) -> dict:
    """Every request as it ended (and no block leaked)."""
    assert engine.leaked_blocks == 0
    return {
        g.request_id: (g.status, g.finish_detail, g.first_scheduled_time, g.first_token_time, g.finish_time, g.num_generated_tokens,
                       [list(s.output) for s in g.seqs], g.num_recompute_preemptions, g.num_swap_preemptions)
        for g in engine._groups.values()
    }


def fitted(policy, config: dict) -> dict:
    """``config`` with what the policy's declarations need: no delay gate for steady-everywhere, V1 mechanics for vllm-v1."""
    if policy is SteadyEverywhere:
        config = {**config, "delay_factor": 0.0}
    if policy == "vllm-v1":  # V1 has no swap: on v0 mechanics with preemption_mode=swap its swapped groups stay there (a stall)
        config = {**config, "vllm_engine": "v1"}
    return config


@given(policy=st.sampled_from(POLICIES), config=configs, spec=requests,
       aborts=st.lists(st.integers(0, 15), max_size=3), abort_step=st.integers(0, 60))
def test_repeating_steady_steps_changes_nothing_observable(policy, config, spec, aborts, abort_step):
    config = fitted(policy, config)
    reqs = [_request(i, *row) for i, row in enumerate(spec)]
    repeated = _trace(policy, config, reqs, aborts, abort_step, steady=True)
    called = _trace(policy, config, reqs, aborts, abort_step, steady=False)
    note(f"{len(repeated[0])} steps")
    assert repeated[0] == called[0]
    assert repeated[1] == called[1]


@given(policy=st.sampled_from(STEADY), config=pressure_configs, spec=pressure_requests,
       aborts=st.lists(st.integers(0, 23), max_size=2), abort_step=st.integers(0, 200))
def test_repeating_steady_steps_under_kv_pressure_changes_nothing_observable(policy, config, spec, aborts, abort_step):
    test_repeating_steady_steps_changes_nothing_observable.hypothesis.inner_test(policy, config, spec, aborts, abort_step)


def _calls(steady: bool, reqs, **config) -> int:
    engine = Engine(EngineConfig(block_size=4, **config), CountingPolicy, SimulatedExecutor(), steady_steps=steady)
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


def test_a_finished_group_is_an_event_unless_waived():
    """holds-back-while-busy counts the running groups in its note: it is called again after each finish."""
    reqs = [req(f"r{i}", 10, 20 + 9 * i) for i in range(5)]
    engine = Engine(EngineConfig(block_size=4, num_gpu_blocks=200), HoldsBackWhileBusy, SimulatedExecutor())
    notes = []
    engine.run(reqs, on_step=lambda report: notes.append(report.output.decisions))
    held = [n[0][3]["running"] for n in notes if n and n[0][2] == "busy"]
    assert held == sorted(held, reverse=True) and len(set(held)) > 1


@pytest.mark.parametrize("call", ["steady('yes')", "steady(arrivals=1)", "steady(finishes=None)"])
def test_steady_takes_only_booleans(call):
    class Bad(VllmDefault):
        name = "bad-steady"

        @hookimpl
        def select_batch(self, step):
            super().select_batch(step)
            eval(f"step.{call}")

    engine = Engine(EngineConfig(), Bad, SimulatedExecutor())
    engine.add_request(req("a", 10, 5))
    with pytest.raises(PolicyError, match="steady: arrivals and finishes must be True or False"):
        engine.step()


def test_steady_outside_select_batch_is_refused():
    kept = []

    class Keeps(VllmDefault):
        name = "keeps-step"

        @hookimpl
        def select_batch(self, step):
            kept.append(step)
            super().select_batch(step)

    engine = Engine(EngineConfig(), Keeps, SimulatedExecutor())
    engine.add_request(req("a", 10, 5))
    engine.step()
    with pytest.raises(PolicyError, match="steady on a step that is over"):
        kept[0].steady()
