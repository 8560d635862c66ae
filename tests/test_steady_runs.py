"""Steady runs change how many reports observers get, never what the engine computes.

``Engine.run`` advances a steady step many times at once (docs/hooks.md "Steady runs") when every
observer takes a whole run (``on_steps``). The main property: for random workloads, configs,
policies and aborts, an engine taking runs and one calling the policy at every step with a report
per step produce the same steps (each run expanded into what its steps' reports would say: batch,
features, durations, notes, finishes, queues, free blocks; block tables wherever the run side has a
report) and the same requests, every step audited.
"""

from __future__ import annotations

import pyarrow.parquet as pq
from helpers import req
from hypothesis import given, note
from hypothesis import strategies as st
from test_steady_steps import (
    POLICIES,
    STEADY,
    _request,
    configs,
    finals,
    fitted,
    observed,
    pressure_configs,
    pressure_requests,
    requests,
)

from kvsched import Engine, EngineConfig, hookimpl
from kvsched.executors.simulated import SimulatedExecutor
from kvsched.experiments.simulation import FinishedCount, SimJob, fan_out
from kvsched.workloads import build_workload


def _tables(bm):
    return {sid: tuple(t) for sid, t in bm.gpu_tables.items()}, {sid: tuple(t) for sid, t in bm.cpu_tables.items()}


class _Recorder:
    """Every step as its report says it; with ``runs``, steady runs too, each expanded step by step."""

    def __init__(self, engine, runs: bool, abort_at, aborts) -> None:
        self.engine, self.steps, self.tables, self.sizes = engine, [], {}, []
        self.abort_at, self.aborts, self.aborted_after = abort_at, aborts, None
        if runs:
            self.on_steps = self._run

    def __call__(self, r) -> None:
        self.steps.append(observed(r))
        self._reported(r.step)

    def _run(self, run) -> None:
        out, last = run.output, len(run.duration) - 1
        batch = [(s.group.request_id, s.num_tokens, s.is_prefill, s.num_cached_tokens) for s in out.scheduled]
        assert out.decisions == tuple(run.decisions(0)) and out.features == run.features(0)
        for i in range(last + 1):
            self.steps.append(
                (
                    run.first + i,
                    run.now[i],
                    run.duration[i],
                    run.features(i),
                    out.lane_decodes,
                    out.num_batched_tokens,
                    batch,
                    [],
                    [],
                    (),
                    (),
                    (),
                    tuple(run.decisions(i)),
                    [g.request_id for g in run.finished] if i == last else [],
                    run.num_waiting[i],
                    run.num_running[i],
                    run.num_swapped,
                    run.free_gpu_blocks[i],
                    run.cache.num_free_cpu_blocks,
                )
            )
        self.sizes.append(last + 1)
        self._reported(run.first + last)

    def _reported(self, step: int) -> None:
        self.tables[step] = _tables(self.engine.scheduler.block_manager)
        if self.aborted_after is None and step >= self.abort_at:
            self.aborted_after = step
            for i in self.aborts:
                self.engine.abort(f"r{i}")


def _trace(policy, config, reqs, aborts, abort_at, runs):
    engine = Engine(EngineConfig(**config, audit_every_step=True), policy, SimulatedExecutor(steady_steps=runs))
    recorder = _Recorder(engine, runs, abort_at, aborts)
    engine.run(reqs, on_step=recorder)
    assert [s[0] for s in recorder.steps] == list(range(engine.num_steps))
    return recorder, finals(engine)


@given(
    policy=st.sampled_from(POLICIES),
    config=configs,
    spec=requests,
    aborts=st.lists(st.integers(0, 15), max_size=3),
    abort_step=st.integers(0, 60),
)
def test_steady_runs_change_nothing_observable(policy, config, spec, aborts, abort_step):
    config = fitted(policy, config)
    reqs = [_request(i, *row) for i, row in enumerate(spec)]
    runs, run_finals = _trace(policy, config, reqs, aborts, abort_step, runs=True)
    # The runs side aborts after the first report at or past abort_step; the reference aborts after that very step.
    each, each_finals = _trace(
        policy, config, reqs, aborts, runs.aborted_after if runs.aborted_after is not None else 1 << 30, runs=False
    )
    note(f"{len(each.steps)} steps, runs of {runs.sizes}")
    assert each.sizes == []
    assert runs.steps == each.steps
    assert run_finals == each_finals
    for step, tables in runs.tables.items():
        assert tables == each.tables[step], step


@given(
    policy=st.sampled_from(STEADY),
    config=pressure_configs,
    spec=pressure_requests,
    aborts=st.lists(st.integers(0, 23), max_size=2),
    abort_step=st.integers(0, 200),
)
def test_steady_runs_under_kv_pressure_change_nothing_observable(policy, config, spec, aborts, abort_step):
    test_steady_runs_change_nothing_observable.hypothesis.inner_test(policy, config, spec, aborts, abort_step)


class _Counts:
    def __init__(self, runs: bool = True) -> None:
        self.steps = self.run_steps = self.runs = 0
        if runs:
            self.on_steps = self._run

    def __call__(self, report) -> None:
        self.steps += 1

    def _run(self, run) -> None:
        self.runs += 1
        self.run_steps += len(run.duration)


def test_most_steps_of_a_long_run_are_taken_in_runs():
    """Under KV pressure (the head refused for want of blocks, arrivals joining behind it) and at low load."""
    for reqs, blocks in (
        ([req(f"r{i}", 40, 60 + 7 * i, arrival=0.01 * i) for i in range(30)], 200),
        ([req(f"r{i}", 10, 50, arrival=2.0 * i) for i in range(5)], 200),
    ):
        engine = Engine(EngineConfig(block_size=4, num_gpu_blocks=blocks), "vllm-default", SimulatedExecutor())
        counts = _Counts()
        engine.run(reqs, on_step=counts)
        assert counts.steps + counts.run_steps == engine.num_steps
        assert counts.run_steps > 2 * counts.steps and counts.runs > 1


def test_an_observer_without_on_steps_sees_every_step():
    engine = Engine(EngineConfig(block_size=4), "vllm-default", SimulatedExecutor())
    counts = _Counts(runs=False)
    engine.run([req(f"r{i}", 10, 50, arrival=2.0 * i) for i in range(5)], on_step=counts)
    assert counts.steps == engine.num_steps > 200
    both = fan_out([_Counts(), _Counts(runs=False)])
    assert not hasattr(both, "on_steps") and hasattr(fan_out([_Counts(), FinishedCount(print)]), "on_steps")


class _PluginSteps:
    def __init__(self) -> None:
        self.steps = 0

    @hookimpl
    def on_step(self, report):
        self.steps += 1


def test_a_plugin_observing_steps_sees_every_step():
    """A registered observer (a pluggy ``on_step``) gets every step's report: the engine takes no run."""
    reqs = [req(f"r{i}", 10, 50, arrival=2.0 * i) for i in range(5)]
    plugin, counts = _PluginSteps(), _Counts()
    engine = Engine(EngineConfig(block_size=4), "vllm-default", SimulatedExecutor(), observers=(plugin,))
    engine.run(reqs, on_step=counts)
    assert plugin.steps == counts.steps == engine.num_steps and counts.runs == 0


def test_max_steps_stops_inside_a_run():
    reqs = [req(f"r{i}", 10, 50, arrival=2.0 * i) for i in range(5)]
    for limit in (1, 7, 40, 123):
        engine = Engine(EngineConfig(block_size=4), "vllm-default", SimulatedExecutor())
        counts = _Counts()
        engine.run(reqs, on_step=counts, max_steps=limit)
        assert engine.num_steps == counts.steps + counts.run_steps == limit


def test_streamed_files_are_the_same_with_and_without_runs(tmp_path):
    """SimJob's time series, decision log and records, written from runs or from every step's report."""
    files = {}
    for name, observer in (("runs", None), ("each", lambda report: None)):
        job = SimJob(
            build_workload("synthetic", num_requests=400, rate=6.0, seed=2),
            config=EngineConfig(num_gpu_blocks=300),
            stream_to=tmp_path / name,
            decision_log=tmp_path / name / "decisions.parquet",
        )
        job.run(on_step=observer)
        files[name] = {
            f: pq.read_table(tmp_path / name / f)
            for f in ("timeseries.parquet", "decisions.parquet", "requests.parquet")
        }
    for f, table in files["runs"].items():
        assert table.num_rows > 100 and table.equals(files["each"][f]), f
