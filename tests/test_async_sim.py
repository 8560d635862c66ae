"""EngineConfig.async_scheduling and the scheduler's time (mechanics/async_lag.py): vLLM's AsyncScheduler in the
simulator, with the step's outputs applied one step late; off, the engine is what it was."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, run_state_machine_as_test

from kvsched import Engine, EngineConfig, Request, SamplingParams
from kvsched.core.view import group_of
from kvsched.executors.cost_model import CostProfile
from kvsched.executors.simulated import SimulatedExecutor
from kvsched.mechanics.async_lag import VLLM_V1_SCHEDULER_MS, VLLM_V1_SCHEDULER_REQUEST_MS, AsyncLag
from kvsched.mechanics.completion import Completion
from kvsched.plugins.discovery import BUILTIN_DISTRIBUTION, installed_policies
from kvsched.testing.machine import PolicyMachine
from kvsched.testing.strategies import engine_configs

# Every step that runs anything takes 10 ms, whatever it runs.
TEN_MS = CostProfile(
    name="ten-ms",
    base_ms=10,
    prefill_token_ms=0,
    decode_seq_ms=0,
    kv_token_ms=0,
    kv_bytes_per_token=0,
    swap_gb_per_s=1,
    copy_gb_per_s=1,
)


def _request(i: int, prompt: int, output: int | None, arrival: float = 0.0, max_tokens: int = 64) -> Request:
    return Request(
        request_id=f"r{i}",
        prompt_len=prompt,
        output_len=output,
        arrival_time=arrival,
        sampling=SamplingParams(max_tokens=max_tokens),
    )


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
    return [
        (g.request_id, g.status, g.first_token_time, g.finish_time, tuple(tuple(s.output) for s in g.seqs))
        for g in sorted(engine.finished, key=lambda g: g.request_id)
    ]


@pytest.mark.parametrize("policy", ["vllm-default", "vllm-v1"])
def test_off_is_the_engine_as_it_was(policy):
    absent, absent_reports = _run(policy, _requests(), profile="llama2-7b-a100")
    off, off_reports = _run(policy, _requests(), profile="llama2-7b-a100", async_scheduling=False)
    assert _rows(off) == _rows(absent)
    assert [(r.now, r.duration) for r in off_reports] == [(r.now, r.duration) for r in absent_reports]
    assert type(off.completion) is Completion  # steps complete as they come: the hot path is the plain one
    if policy == "vllm-default":
        assert off.scheduler.fast_path is not None  # the decode lane (and with it steady runs) is kept


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
    assert lagged.completion.wasted_tokens == 1


def test_a_length_cap_is_foreseen():
    # No EOS (output_len None): max_tokens ends it, which vLLM's async scheduler sees coming.
    request = [_request(0, 8, None, max_tokens=3)]
    _, sync_reports = _run(requests=request)
    lagged, lag_reports = _run(requests=request, async_scheduling=True)
    assert _left(lag_reports, "r0") == _left(sync_reports, "r0") == 2
    assert lagged.completion.wasted_tokens == 0


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
    model = engine.completion
    assert (model.step_s, model.request_s) == (VLLM_V1_SCHEDULER_MS / 1e3, VLLM_V1_SCHEDULER_REQUEST_MS / 1e3)
    assert engine.scheduler.fast_path is None


@pytest.mark.parametrize("policy", ["vllm-default", "vllm-v1"])
def test_under_kv_pressure_every_request_ends_and_no_block_leaks(policy):
    # Preemptions, and stops of requests that were preempted meanwhile: audited every step by _run.
    requests = [_request(i, 40 + 13 * i % 70, 5 + 11 * i % 60) for i in range(40)]
    sync, _ = _run(
        policy,
        requests,
        profile="llama2-7b-a100",
        num_gpu_blocks=40,
        num_cpu_blocks=40,
        block_size=8,
        max_num_batched_tokens=256,
        max_num_seqs=16,
    )
    lagged, _ = _run(
        policy,
        requests,
        profile="llama2-7b-a100",
        num_gpu_blocks=40,
        num_cpu_blocks=40,
        block_size=8,
        max_num_batched_tokens=256,
        max_num_seqs=16,
        async_scheduling=True,
    )
    assert [r[4] for r in _rows(lagged)] == [r[4] for r in _rows(sync)]  # the same tokens, whatever the lag
    model = lagged.completion
    if policy == "vllm-default":  # here some stop while preempted: they end all the same
        assert model.stops_unscheduled > 0
    assert model.wasted_tokens + model.stops_unscheduled == len(requests)


BUILT_IN = sorted(i.name for i in installed_policies() if i.distribution == BUILTIN_DISTRIBUTION)


@st.composite
def pressed_workloads(draw, n_max: int = 3):
    """Requests with ``n`` up to ``n_max``, some sharing a prompt prefix, arriving faster than a small pool serves."""
    t, requests = 0.0, []
    for i in range(draw(st.integers(1, 40))):
        t += draw(st.floats(0, 0.05))
        shared = tuple(range(500, 500 + draw(st.sampled_from((0, 0, 16, 40)))))
        own = tuple(range(10_000 * (i + 1), 10_000 * (i + 1) + draw(st.integers(1, 120))))
        requests.append(
            Request(
                request_id=f"r{i}",
                prompt_token_ids=shared + own,
                output_len=draw(st.integers(1, 40)),
                arrival_time=t,
                sampling=SamplingParams(n=draw(st.integers(1, n_max)), max_tokens=48),
            )
        )
    return requests


def _fanned_out(requests):
    """Each request as the ``n`` requests V1's front end makes of it (mechanics/fanout.py): ``{i}_{id}``, ``n = 1``."""
    one = {"n": 1}
    return [
        r.model_copy(update={"request_id": f"{i}_{r.request_id}", "sampling": r.sampling.model_copy(update=one)})
        for r in requests
        for i in range(r.sampling.n)
    ]


def _outputs(groups):
    return {g.request_id: sorted(tuple(s.output) for s in g.seqs) for g in groups}


@settings(max_examples=max(10, settings.default.max_examples // 5))
@given(
    policy=st.sampled_from(BUILT_IN),
    requests=pressed_workloads(),
    blocks=st.integers(24, 120),
    block_size=st.sampled_from((4, 8, 16)),
    caching=st.booleans(),
    retain=st.booleans(),
)
def test_async_runs_end_every_request_once_with_n_samples_under_kv_pressure(
    policy, requests, blocks, block_size, caching, retain
):
    """Every built-in policy, async scheduling, ``n > 1``, prefix caching and a small pool together (issue 36: a
    stop of a V1 fan-out child in the step before, not run in this one, ended the child as if it were a request)."""
    config = EngineConfig(
        num_gpu_blocks=blocks,
        block_size=block_size,
        enable_prefix_caching=caching,
        max_num_seqs=16,
        audit_every_step=True,
    )
    ended, engine = (
        [],
        Engine(
            config.model_copy(update={"async_scheduling": True}), policy, SimulatedExecutor(), retain_finished=retain
        ),
    )
    engine.run(requests, on_step=lambda report: ended.extend(map(group_of, report.finished)))
    assert sorted(g.request_id for g in ended) == sorted(r.request_id for r in requests)
    assert engine.leaked_blocks == 0
    assert engine.finished == ended if retain else not engine.groups
    sync = Engine(config, policy, SimulatedExecutor())
    sync.run(requests)
    assert _outputs(ended) == _outputs(sync.finished)  # the same tokens, whatever the lag


@settings(max_examples=max(10, settings.default.max_examples // 5))
@given(
    policy=st.sampled_from(["vllm-v1", "lcf", "hrrn", "session-affinity"]),
    requests=pressed_workloads(),
    blocks=st.integers(30, 120),
    caching=st.booleans(),
)
def test_with_async_scheduling_a_fanned_out_request_is_its_children(policy, requests, blocks, caching):
    """Under V1 mechanics a request with ``n`` samples runs as ``n`` requests and ends with its last one, the lag
    included: its first token and finish are its children's first and last, when they run as requests of their own."""
    config = EngineConfig(
        num_gpu_blocks=blocks,
        block_size=8,
        enable_prefix_caching=caching,
        max_num_seqs=16,
        async_scheduling=True,
        audit_every_step=True,
    )
    parents, children = Engine(config, policy, SimulatedExecutor()), Engine(config, policy, SimulatedExecutor())
    parents.run(requests)
    children.run(_fanned_out(requests))
    child = {g.request_id: g for g in children.finished}
    for parent in parents.finished:
        mine = [child[f"{i}_{parent.request_id}"] for i in range(parent.n)]
        firsts = [c.first_token_time for c in mine if c.first_token_time is not None]
        assert parent.finish_time == max(c.finish_time for c in mine), parent.request_id
        assert parent.first_token_time == (min(firsts) if firsts else None), parent.request_id
        assert sorted(tuple(s.output) for s in parent.seqs) == sorted(tuple(c.seqs[0].output) for c in mine)


class AsyncMachine(PolicyMachine):
    """The conformance suite's random arrivals (``n`` up to 3, shared prefixes), aborts and steps, on small pools
    (prefix caching drawn), with async scheduling; each step ends only requests that were submitted, each once."""

    @initialize(config=engine_configs(), retain=st.booleans())
    def start(self, config, retain) -> None:
        super().start(config.model_copy(update={"async_scheduling": True}))
        assert isinstance(self.engine.completion, AsyncLag)
        self.engine.retain_finished = retain
        self.ended: set[str] = set()

    def _step(self):
        report = super()._step()
        for group in report.finished:
            assert group.request_id in {f"r{i}" for i in range(self.submitted)} - self.ended, group.request_id
            self.ended.add(group.request_id)
        finished = [g.request_id for g in self.engine.finished]
        assert len(set(finished)) == len(finished) and set(finished) <= {f"r{i}" for i in range(self.submitted)}
        return report


@pytest.mark.parametrize("policy", ["vllm-default", "vllm-v1", "lpm", "lcf"])
def test_the_invariants_hold_with_async_scheduling(policy):
    machine = AsyncMachine.for_policy(policy)
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=60,
            stateful_step_count=40,
            derandomize=True,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
