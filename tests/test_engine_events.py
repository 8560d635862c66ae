"""A single engine is a fleet of one (issue 33): ``Engine.run`` and the fleet's loop drive an engine by the same
events, so when a step may start, a stall and the arrival order are decided in one place (``core/engine.py``), and
steady runs are taken through one door (``Engine.steady_run``; whether one may go, the simulator's
``executors/fast_path.py`` decides), for both, and read the same from either."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsched import Engine, EngineConfig, PolicyError, SimulatedExecutor, StallError, hookimpl
from kvsched.cluster import Cluster, FleetSpec, ReplicaGroup
from kvsched.metrics.records import row_of
from kvsched.metrics.requests import FIELDS
from kvsched.policies.vllm_default import VllmDefault
from tests.test_bad_inputs import NeverAdmits, req

NEVER_ADMITS = "tests.test_bad_inputs:NeverAdmits"


class Watcher:
    """An ``on_step`` plugin: it sees every step's report, so the engine takes no steady run."""

    @hookimpl
    def on_step(self, report):
        pass


def test_a_stall_reads_the_same_from_one_engine_and_from_a_fleet_of_one():
    requests = [req("first", 40, 4, arrival=0.5), req("second", 40, 4, arrival=0.7)]
    fleet = Cluster(FleetSpec(replicas=[ReplicaGroup(policy=NEVER_ADMITS)]))
    replica = fleet.replicas[0]
    alone = Engine(replica.engine.config, NeverAdmits, SimulatedExecutor(replica.profile_name))
    with pytest.raises(StallError) as engine_stall:
        alone.run(requests)
    with pytest.raises(StallError) as fleet_stall:
        fleet.run(requests)
    assert str(fleet_stall.value) == f"replica {replica.name}: {engine_stall.value}"
    assert "the oldest waiting request, first (arrived at 0.500 s)" in str(fleet_stall.value)
    assert replica.engine.num_steps == alone.num_steps


def test_requests_out_of_arrival_order_are_refused_alike():
    requests = [req("late", 40, 4, arrival=1.0), req("early", 40, 4, arrival=0.5)]
    with pytest.raises(ValueError, match="^request 'early' arrives before 'late'$"):
        Engine(EngineConfig(), "vllm-default", SimulatedExecutor()).run(iter(requests), in_order=True)
    with pytest.raises(ValueError, match="^request 'early' arrives before 'late'$"):
        Cluster(FleetSpec(replicas=[ReplicaGroup()])).run(requests)


def test_after_a_step_that_ran_nothing_the_next_waits_for_the_next_arrival():
    engine = Engine(EngineConfig(), NeverAdmits, SimulatedExecutor())
    engine.add_request(req("a", 40, 4))
    assert engine.next_step_at(5.0) == engine.now == 0.0  # no step yet: now
    engine.step()  # admits nothing
    assert engine.now > 0.0
    assert engine.next_step_at(5.0) == 5.0
    assert engine.next_step_at(math.inf) == engine.now  # none to come, not yet a stall: step on
    engine.add_request(req("b", 40, 4))  # new work: the next step is now, and a stall is counted afresh
    assert engine.next_step_at(5.0) == engine.now


def test_a_steady_run_is_taken_only_where_the_fast_path_says_it_may():
    engine = Engine(EngineConfig(), "vllm-default", SimulatedExecutor())
    assert not engine.steady_run(math.inf).started and engine.num_steps == 0  # nothing ran yet: no step to repeat
    engine.add_request(req("a", 40, 200))
    engine.step()  # the prompt
    engine.step()  # a decode: the step the scheduler may repeat
    steps = engine.num_steps
    run = engine.steady_run(engine.now + 0.5)
    assert len(run.started) == engine.num_steps - steps > 1
    assert all(t < engine.now for t in run.started) and not run.finished
    assert not run.joins and (run.num_waiting, run.num_running, run.num_swapped) == (
        0,
        1,
        0,
    )  # nothing waited: an arrival would have ended it
    assert len(engine.steady_run(math.inf, limit=3).started) == 3
    observed = Engine(EngineConfig(), "vllm-default", SimulatedExecutor(), observers=(Watcher(),))
    observed.add_request(req("a", 40, 200))
    observed.step(), observed.step()
    assert not observed.steady_run(math.inf).started  # an observer sees every step: no steady run
    assert observed.num_steps == 2
    cached = Engine(EngineConfig(enable_prefix_caching=True), "vllm-default", SimulatedExecutor())
    assert cached.fast_path is None and cached.steady_run(math.inf) is None  # no fast path: no run, and no error


@pytest.mark.parametrize("limit", [0, -1, -math.inf, math.nan])
def test_a_steady_run_takes_no_step_at_a_limit_of_none(limit):
    """``limit`` counts steps, at most that many: before, a negative one (the old ``-1``: no limit) or NaN ran the
    whole run."""
    engine = Engine(EngineConfig(), "vllm-default", SimulatedExecutor())
    engine.add_request(req("a", 40, 200))
    engine.step(), engine.step()  # the prompt, then a decode: a step to repeat
    steps, now = engine.num_steps, engine.now
    assert not engine.steady_run(math.inf, limit=limit).started
    assert (engine.num_steps, engine.now) == (steps, now)
    assert len(engine.steady_run(math.inf, limit=2).started) == 2  # the step is still one to repeat


def test_one_engine_and_a_fleet_of_one_take_their_steady_runs_through_the_same_door():
    requests = [req(f"r{i}", 40, 60, arrival=0.05 * i) for i in range(30)]
    fleet = Cluster(FleetSpec(replicas=[ReplicaGroup()]))
    replica = fleet.replicas[0]
    alone = Engine(replica.engine.config, "vllm-default", SimulatedExecutor(replica.profile_name))
    taken = {}
    for name, engine in (("alone", alone), ("fleet", replica.engine)):
        door = engine.steady_run

        def counted(*args, door=door, name=name, **kwargs):
            run = door(*args, **kwargs)
            taken[name] = taken.get(name, 0) + len(run.started)
            return run

        engine.steady_run = counted
    alone.run(requests)
    fleet.run(requests)
    assert alone.num_steps == replica.engine.num_steps
    assert taken["alone"] == taken["fleet"] > alone.num_steps // 2  # most steps, advanced at once, alike


class AsksForARunInsideItsStep(VllmDefault):
    """``vllm-default``, asking its own engine for a steady run while it builds a step."""

    engine = None

    @hookimpl
    def select_batch(self, step):
        self.engine.steady_run(math.inf)


def test_a_steady_run_asked_for_inside_a_hook_is_refused_by_name():
    """As ``step``, ``run``, ``add_request`` and ``abort`` are: a hook reads its engine, never drives it (before, the
    call answered an empty run, which a caller could not tell from a run that may not go)."""
    policy = AsksForARunInsideItsStep()
    engine = Engine(EngineConfig(), policy, SimulatedExecutor())
    policy.engine = engine
    with pytest.raises(PolicyError, match=r"engine\.steady_run\(\) called inside select_batch"):
        engine.run([req(f"r{i}", 40, 60, arrival=0.05 * i) for i in range(3)])
    assert engine.scheduler.audit() == []


def test_the_steps_a_run_took_count_when_an_arrival_joining_it_is_refused():
    """A steady run behind a refused head takes arrivals in as it goes; one refused there (a duplicate id) ends the
    run with an error, and the steps it took before still count (before, ``num_steps`` missed the whole run)."""
    engine = Engine(EngineConfig(num_gpu_blocks=100), "vllm-default", SimulatedExecutor())
    taken = [0]
    complete, lane_seconds = engine.complete, engine.executor.lane_seconds

    def completed(*args, **kwargs):  # a step taken alone
        taken[0] += 1
        return complete(*args, **kwargs)

    def seconds_of(n):  # a run's step costs one call of its cost function
        cost = lane_seconds(n)

        def counted(k):
            taken[0] += 1
            return cost(k)

        return counted

    engine.complete, engine.executor.lane_seconds = completed, seconds_of
    requests = [req(f"r{i}", 64, 400) for i in range(2)] + [req("big", 1500, 10, arrival=0.01)]  # big waits refused
    requests += [req(f"late{i}", 40, 4, arrival=0.5 + 0.1 * i) for i in range(5)] + [req("late2", 40, 4, arrival=1.2)]
    with pytest.raises(ValueError, match="duplicate request id 'late2'"):
        engine.run(requests)
    assert engine.num_steps == taken[0] > 100
    assert engine.scheduler.audit() == []


def test_a_run_without_on_step_still_reports_every_step_to_its_observers():
    """``Engine.run`` makes no step report nobody reads; an observer (``on_step`` hook) still gets each one."""
    from kvsched.core.report import StepReport

    class Watcher:
        def __init__(self):
            self.reports = []

        @hookimpl
        def on_step(self, report):
            self.reports.append(report)

    watcher = Watcher()
    config = EngineConfig(num_gpu_blocks=64, block_size=16, decode_lane=False)
    engine = Engine(config, "vllm-default", SimulatedExecutor(), observers=(watcher,))
    engine.run([req(f"r{i}", 40, 6, arrival=0.01 * i) for i in range(5)])
    assert len(watcher.reports) == engine.num_steps > 0
    assert all(type(r) is StepReport for r in watcher.reports)
    assert Engine(config, "vllm-default", SimulatedExecutor()).step(report=False) is None


def test_a_step_begun_and_ended_unreported_applies_as_a_step_does():
    """A fleet's replica splits each step (``begin_step``, ``end_step(report=False)``) and reads what it reports from
    ``step_seconds`` and ``occupancy()``: each must be what ``Engine.step``'s report says of the same step, to the
    bit (a replica's busy time is their sum). Under KV pressure, so that groups wait, are preempted and finish."""
    config = EngineConfig(num_gpu_blocks=24, block_size=16, max_num_batched_tokens=512, decode_lane=False)
    requests = [req(f"r{i}", 60 + 7 * i, 30 + i, arrival=0.0) for i in range(8)]
    stepped, split = (Engine(config, "vllm-default", SimulatedExecutor()) for _ in range(2))
    assert split.step_seconds == 0.0  # no step under way
    for r in requests:
        stepped.add_request(r), split.add_request(r)
    preempted = 0
    while stepped.has_unfinished():
        report = stepped.step()
        split.begin_step()
        assert split.step_seconds == report.duration
        assert split.end_step(report=False) is None  # no report made: nobody reads it
        assert split.step_seconds == 0.0
        assert split.now == report.now
        counts = (report.num_waiting, report.num_running, report.num_swapped, report.cache.num_free_gpu_blocks)
        assert split.occupancy() == counts
        assert [g.request_id for g in split.take_finished()] == [g.request_id for g in report.finished]
        preempted += len(report.output.preempted)
    assert preempted and not split.has_unfinished() and split.num_steps == stepped.num_steps
    assert split.leaked_blocks == 0


def test_a_step_ended_unreported_still_reports_to_its_observers():
    """``end_step(report=False)`` skips the report only where nobody reads it: an ``on_step`` plugin gets it, and so
    does the caller."""
    engine = Engine(EngineConfig(), "vllm-default", SimulatedExecutor(), observers=(Watcher(),))
    engine.add_request(req("a", 40, 4))
    engine.begin_step()
    report = engine.end_step(report=False)
    assert report is not None and report.step == 0 and report.now == engine.now


class StepLog:
    """An observer of every step (no ``on_steps``: no steady run is taken), noting what each report says."""

    def __init__(self):
        self.steps = []

    def __call__(self, r):
        finished = tuple(g.request_id for g in r.finished)
        self.steps.append((r.step, r.now, r.duration, r.num_waiting, r.num_running, r.num_swapped, finished))


def by_engine_run(requests, policy, config, on_step=None):
    """``Engine.run``'s own loop (the library's): its engine and records, in the order the requests were added."""
    from operator import attrgetter

    from kvsched.metrics.requests import RequestMetrics

    engine = Engine(config, policy, SimulatedExecutor())
    engine.run(requests, on_step=on_step)
    return engine, [RequestMetrics.of(g) for g in sorted(engine.finished, key=attrgetter("index"))]


ASYNC = {"async_scheduling": True}
TIMINGS = {
    "sync": {},
    "scheduler_ms": {"scheduler_ms": 1.0},
    "async": ASYNC,
    "async, scheduler_ms": {**ASYNC, "scheduler_ms": 2.0},
}


@pytest.mark.parametrize("policy", ["vllm-default", "vllm-v1", "fcfs"])
@pytest.mark.parametrize("timing", TIMINGS.values(), ids=TIMINGS.keys())
def test_engine_run_replays_a_workload_as_the_fleet_of_one_with_the_engine_loops_results(policy, timing):
    """``engine run`` (``run_simulation``) runs its engine as the cluster loop's one-replica, no-router case: the same
    records, steps and time series (steady runs told whole) as ``Engine.run``'s own loop, under KV pressure. Before the
    fleet of one held an arrival mid-step until the step's end, its time series counted that arrival waiting one step
    early (``waiting_peak`` differed in four reference runs)."""
    from kvsched.experiments.simulation import run_simulation
    from kvsched.metrics.timeseries import TimeSeriesRecorder

    requests = [req(f"r{i}", 50 + 37 * i % 400, 5 + 11 * i % 90, arrival=0.02 * i) for i in range(150)]
    config = EngineConfig(num_gpu_blocks=96, max_num_batched_tokens=2048, max_model_len=2048, **timing)
    series = TimeSeriesRecorder(), TimeSeriesRecorder()
    engine, records = by_engine_run(requests, policy, config, series[0])
    fleet = run_simulation(requests, policy, config, "llama2-7b-a100", on_step=series[1])
    assert fleet.requests == records and any(m.preemptions_recompute for m in records)
    assert fleet.engine.num_steps == engine.num_steps and fleet.engine.now == engine.now
    assert series[1].frame().equals(series[0].frame()) and len(series[0].frame()) == engine.num_steps


@settings(max_examples=30, deadline=None)
@given(
    specs=st.lists(st.tuples(st.integers(1, 700), st.integers(1, 120), st.floats(0, 0.1)), min_size=1, max_size=40),
    policy=st.sampled_from(["vllm-default", "vllm-v1", "fcfs"]),
    timing=st.sampled_from(list(TIMINGS.values())),
)
def test_the_fleet_of_one_tells_each_step_as_engine_run_does(specs, policy, timing):
    """An observer of every step sees the same reports (times, counts, finished) from either loop, arrivals during a
    step counted from the step after it, and the records agree (Hypothesis)."""
    from kvsched.experiments.simulation import run_simulation

    t, requests = 0.0, []
    for i, (prompt, output, gap) in enumerate(specs):
        t += gap
        requests.append(req(f"r{i}", prompt, output, arrival=t))
    config = EngineConfig(num_gpu_blocks=64, max_num_batched_tokens=1024, max_model_len=1024, **timing)
    alone, fleet = StepLog(), StepLog()
    engine, records = by_engine_run(requests, policy, config, alone)
    result = run_simulation(requests, policy, config, "llama2-7b-a100", on_step=fleet)
    assert fleet.steps == alone.steps and len(alone.steps) == engine.num_steps
    assert result.requests == records


def test_engine_run_stalls_with_the_engine_loops_words():
    """The fleet of one has no router and no replica to name: its stall reads as ``Engine.run``'s (a fleet's is
    prefixed by the replica's name)."""
    from kvsched.experiments.simulation import run_simulation

    requests = [req("first", 40, 4, arrival=0.5), req("second", 40, 4, arrival=0.7)]
    with pytest.raises(StallError) as alone:
        Engine(EngineConfig(), NeverAdmits, SimulatedExecutor()).run(requests)
    with pytest.raises(StallError) as fleet:
        run_simulation(requests, NEVER_ADMITS)
    assert str(fleet.value) == str(alone.value) and str(alone.value).startswith("policy 'never-admits'")


def test_the_fleet_of_one_keeps_nothing_for_a_router_it_does_not_have():
    """No reports, no prefix-cache finds, no first tokens watched: what a fleet keeps for its router would grow with
    a streamed run (before ``Replica.alone``, each request's cache finds stayed in ``cached_by_request``)."""
    from kvsched import Request, SamplingParams
    from kvsched.cluster.fleet_of_one import FleetOfOne
    from kvsched.metrics.records import RequestLog

    shared = tuple(range(64))  # four blocks every prompt starts with
    requests = [
        Request(
            request_id=f"r{i}",
            prompt_token_ids=(*shared, 1000 + i),
            output_len=8,
            arrival_time=0.01 * i,
            sampling=SamplingParams(max_tokens=8),
        )
        for i in range(40)
    ]
    engine = Engine(EngineConfig(enable_prefix_caching=True), "vllm-default", SimulatedExecutor())
    fleet = FleetOfOne(engine, RequestLog())
    records = fleet.run(requests)
    replica = fleet.replicas[0]
    assert [m.request_id for m in records] == [r.request_id for r in requests]
    assert sum(m.prompt_tokens - m.computed_tokens > 0 for m in records) > 30  # the shared prefix was found cached
    assert replica.cached_by_request == {} and replica.in_prefill() == (0, 0)
    assert replica.signals_as_of(engine.now) == (0.0, 0, 0, 0, EngineConfig().num_gpu_blocks)  # the first, only


class InPairs(VllmDefault):
    """Admits prompts only once two wait: a lone request waits, its step scheduling nothing (an idle step)."""

    name = "in-pairs"

    @hookimpl
    def select_batch(self, step):
        if len(step.waiting) >= 2:
            for group in step.waiting:
                step.admit(group)
        step.advance_running()
        return True


def test_a_request_arriving_during_an_idle_step_is_stepped_at_once_by_every_loop():
    """``a``'s first step schedules nothing (it waits for a pair) and ``b`` arrives while that step runs: ``Engine.run``
    admits ``b`` after the step and steps at once, and so do the fleet of one and a fleet behind a router. Before, a
    fleet's replica queued ``b`` mid-step, the step's end still counted the engine idle, and it waited for the next
    arrival anywhere (``c``, 5 s later) to step again; ``d`` pairs with ``c``."""
    from kvsched.experiments.simulation import run_simulation

    requests = [req(name, 40, 4, arrival=t) for name, t in (("a", 0.0), ("b", 0.0005), ("c", 5.0), ("d", 5.0005))]
    _, records = by_engine_run(requests, InPairs, EngineConfig())
    assert records[1].first_scheduled_time < 0.01  # a step right after the idle one admitted the pair
    assert run_simulation(requests, InPairs).requests == records
    fleet = Cluster(FleetSpec(replicas=[ReplicaGroup(policy="tests.test_engine_events:InPairs")])).run(requests)
    assert [row[: len(FIELDS)] for row in fleet.rows] == [row_of(m) for m in records]


def test_an_id_used_again_after_its_request_ended_is_served_alike_in_memory_and_streamed(tmp_path):
    """``engine run`` hands each finished group over as it ends, so an id is free again once its request has ended, in
    memory as when streamed (before, an in-memory run refused it, its engine still holding the finished group); one
    still in flight is refused by the engine."""
    from kvsched.experiments.simulation import run_simulation

    again = [req("a", 40, 4, arrival=0.0), req("a", 40, 4, arrival=50.0)]
    kept, streamed = (run_simulation(again, stream_to=to).requests for to in (None, tmp_path))
    assert [m.arrival_time for m in kept] == [m.arrival_time for m in streamed] == [0.0, 50.0]
    with pytest.raises(ValueError, match="duplicate request id 'a'"):
        run_simulation([req("a", 40, 400, arrival=0.0), req("a", 40, 4, arrival=0.01)])
