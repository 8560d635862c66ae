"""EngineConfig.async_scheduling and the scheduler's time (core/async_lag.py): vLLM's AsyncScheduler in the
simulator, with the step's outputs applied one step late; off, the engine is what it was."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import initialize, run_state_machine_as_test

from kvsched import Engine, EngineConfig, Request, SamplingParams
from kvsched.core.async_lag import VLLM_V1_SCHEDULER_MS, VLLM_V1_SCHEDULER_REQUEST_MS
from kvsched.executors.cost_model import CostProfile
from kvsched.executors.simulated import SimulatedExecutor
from kvsched.testing.machine import PolicyMachine
from kvsched.testing.strategies import engine_configs

# Every step that runs anything takes 10 ms, whatever it runs.
TEN_MS = CostProfile(name="ten-ms", base_ms=10, prefill_token_ms=0, decode_seq_ms=0, kv_token_ms=0,
                     kv_bytes_per_token=0, swap_gb_per_s=1, copy_gb_per_s=1)


def _request(i: int, prompt: int, output: int | None, arrival: float = 0.0, max_tokens: int = 64) -> Request:
    return Request(request_id=f"r{i}", prompt_len=prompt, output_len=output, arrival_time=arrival,
                   sampling=SamplingParams(max_tokens=max_tokens))


def _run(policy: str = "vllm-default", requests=None, profile=TEN_MS, **config):
    engine = Engine(EngineConfig(audit_every_step=True, **config), policy, SimulatedExecutor(profile))
    reports = []
    engine.run(requests if requests is not None else [_request(0, 8, 3)], on_step=reports.append)
    assert engine.leaked_blocks == 0 and not engine.has_unfinished()
    return engine, reports


def _left(reports, request_id: str) -> int:
    """The step whose report ends ``request_id``."""
    return next(r.step for r in reports if any(g.request_id == request_id for g in r.finished))


def _requests(n: int = 60):
    return [_request(i, 30 + 7 * i % 90, 3 + 5 * i % 40, arrival=0.004 * i) for i in range(n)]


def _rows(engine):
    return [(g.request_id, g.status, g.first_token_time, g.finish_time, tuple(tuple(s.output) for s in g.seqs))
            for g in sorted(engine.finished, key=lambda g: g.request_id)]


@pytest.mark.parametrize("policy", ["vllm-default", "vllm-v1"])
def test_off_is_the_engine_as_it_was(policy):
    absent, absent_reports = _run(policy, _requests(), profile="llama2-7b-a100")
    off, off_reports = _run(policy, _requests(), profile="llama2-7b-a100", async_scheduling=False)
    assert _rows(off) == _rows(absent)
    assert [(r.now, r.duration) for r in off_reports] == [(r.now, r.duration) for r in absent_reports]
    for name in ("complete", "_apply", "_append", "_stop_if_done", "_arrive"):
        assert name not in off.__dict__  # nothing installed: the hot path is the class's own
    if policy == "vllm-default":
        assert off.scheduler.lane is not None  # the decode lane (and with it steady runs) is kept


def test_a_stopping_request_occupies_one_more_step_and_leaves_on_time():
    # Prompt step 0 samples token 1; decodes 1 and 2 sample tokens 2 and 3 (EOS). Async: step 3 was
    # scheduled before step 2's EOS was known, so the request runs in it (a wasted slot) and leaves there.
    sync, sync_reports = _run()
    lagged, lag_reports = _run(async_scheduling=True, scheduler_ms=0, scheduler_request_ms=0)
    assert _left(sync_reports, "r0") == 2
    assert _left(lag_reports, "r0") == 3
    assert [len(r.output.scheduled) for r in lag_reports] == [1, 1, 1, 1]
    (a,), (b,) = sync.finished, lagged.finished
    assert b.seqs[0].output == a.seqs[0].output  # the wasted slot's token is dropped
    assert b.finish_time == a.finish_time == pytest.approx(0.03)  # its last token came out at the end of step 2
    assert lagged.__dict__["_apply"].__self__.wasted_tokens == 1


def test_a_length_cap_is_foreseen():
    # No EOS (output_len None): max_tokens ends it, which vLLM's async scheduler sees coming.
    request = [_request(0, 8, None, max_tokens=3)]
    _, sync_reports = _run(requests=request)
    lagged, lag_reports = _run(requests=request, async_scheduling=True)
    assert _left(lag_reports, "r0") == _left(sync_reports, "r0") == 2
    assert lagged.__dict__["_apply"].__self__.wasted_tokens == 0


def test_an_arrival_during_a_step_is_first_seen_a_step_later():
    # r1 arrives while step 0 (r0's prompt) runs: sync schedules it in step 1, async in step 2, since
    # step 1 was scheduled as step 0 began.
    requests = [_request(0, 8, 5), _request(1, 8, 5, arrival=0.005)]
    sync, sync_reports = _run(requests=requests)
    lagged, lag_reports = _run(requests=requests, async_scheduling=True, scheduler_ms=0, scheduler_request_ms=0)

    def admitted(reports):
        return next(r.step for r in reports if any(sg.group.request_id == "r1" for sg in r.output.scheduled))

    assert admitted(sync_reports) == 1
    assert admitted(lag_reports) == 2


def test_durations_sync_add_the_scheduler_time_async_hide_it():
    requests = [_request(0, 8, 4)]  # four steps of one request, back to back
    for sched_ms, hidden in ((4.0, [14, 10, 10, 10]), (25.0, [35, 25, 25, 25])):
        _, sync = _run(requests=requests, scheduler_ms=sched_ms - 1, scheduler_request_ms=1)
        assert [round(r.duration * 1e3, 9) for r in sync] == [10 + sched_ms] * 4
        _, lagged = _run(requests=requests, async_scheduling=True, scheduler_ms=sched_ms - 1, scheduler_request_ms=1)
        # The first step has nothing to hide behind; the wasted fifth step is hidden like the rest.
        assert [round(r.duration * 1e3, 9) for r in lagged] == hidden + [hidden[-1]]


def test_async_defaults_to_vllm_v1s_scheduler_time():
    engine = Engine(EngineConfig(async_scheduling=True), "vllm-v1", SimulatedExecutor())
    model = engine.__dict__["complete"].__self__
    assert (model.step_s, model.request_s) == (VLLM_V1_SCHEDULER_MS / 1e3, VLLM_V1_SCHEDULER_REQUEST_MS / 1e3)
    assert engine.scheduler.lane is None


@pytest.mark.parametrize("policy", ["vllm-default", "vllm-v1"])
def test_under_kv_pressure_every_request_ends_and_no_block_leaks(policy):
    # Preemptions, and stops of requests that were preempted meanwhile: audited every step by _run.
    requests = [_request(i, 40 + 13 * i % 70, 5 + 11 * i % 60) for i in range(40)]
    sync, _ = _run(policy, requests, profile="llama2-7b-a100", num_gpu_blocks=40, num_cpu_blocks=40, block_size=8,
                   max_num_batched_tokens=256, max_num_seqs=16)
    lagged, _ = _run(policy, requests, profile="llama2-7b-a100", num_gpu_blocks=40, num_cpu_blocks=40, block_size=8,
                     max_num_batched_tokens=256, max_num_seqs=16, async_scheduling=True)
    assert [r[4] for r in _rows(lagged)] == [r[4] for r in _rows(sync)]  # the same tokens, whatever the lag
    model = lagged.__dict__["_apply"].__self__
    if policy == "vllm-default":  # here some stop while preempted: they end all the same
        assert model.stops_unscheduled > 0
    assert model.wasted_tokens + model.stops_unscheduled == len(requests)


class AsyncMachine(PolicyMachine):
    """The conformance suite's random arrivals, aborts and steps, on an engine with async scheduling."""

    @initialize(config=engine_configs())
    def start(self, config) -> None:
        super().start(config.model_copy(update={"async_scheduling": True}))
        assert "complete" in self.engine.__dict__


@pytest.mark.parametrize("policy", ["vllm-default", "vllm-v1", "lpm"])
def test_the_invariants_hold_with_async_scheduling(policy):
    machine = AsyncMachine.for_policy(policy)
    run_state_machine_as_test(machine, settings=settings(max_examples=25, stateful_step_count=25, derandomize=True,
                                                         deadline=None, suppress_health_check=list(HealthCheck)))
