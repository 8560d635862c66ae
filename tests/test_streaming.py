"""Bounded-memory runs: an engine that retains no finished request, records streamed to Parquet.

The streamed run must give exactly what the in-memory run gives (records, summary, time series),
write its row groups while it runs (not at the end), hold only unfinished requests, and read its
requests lazily.
"""

import gc
import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from kvsched import Engine, EngineConfig, Request, SamplingParams
from kvsched.core.sequence import SequenceGroup
from kvsched.executors.simulated import SimulatedExecutor
from kvsched.experiments.simulation import SimJob
from kvsched.metrics.records import RequestLog, RequestTable
from kvsched.metrics.requests import ordered_sum
from kvsched.workloads import SyntheticSpec, build_workload
from kvsched.workloads.inference_perf import load_inference_perf

TIGHT = EngineConfig(num_gpu_blocks=300, num_cpu_blocks=200, max_model_len=1400, max_num_batched_tokens=1400)


def tenants_workload():
    return SyntheticSpec(num_requests=300, tenants={"a": 1, "b": 3}, n={1: 0.8, 3: 0.2}, seed=4)


@pytest.mark.parametrize(
    "workload", [build_workload(num_requests=300), tenants_workload()], ids=["embedded", "tenants-n3"]
)
def test_streamed_run_equals_the_in_memory_run(workload, tmp_path):
    kept = SimJob(workload, config=TIGHT, slo_ttft=5.0, slo_tpot=0.1).run()
    streamed = SimJob(workload, config=TIGHT, slo_ttft=5.0, slo_tpot=0.1, stream_to=tmp_path).run()
    s = kept.summary
    assert s["preemptions"]["recompute"] > 0 and s["preemptions"]["swap"] > 0  # the records cover preempted requests
    assert json.dumps(streamed.summary) == json.dumps(s)
    assert list(streamed.result.requests) == kept.result.requests  # same rows, same (arrival) order
    assert streamed.timeseries.frame().equals(kept.timeseries.frame())
    assert {p.name for p in tmp_path.iterdir()} == {"requests.parquet", "timeseries.parquet"}
    assert streamed.result.engine._groups == {} and streamed.result.engine.finished == []


def test_ignored_requests_are_recorded_in_order(tmp_path):
    workload = build_workload(num_requests=200)  # prompts up to 1,536 tokens; a 1,000-token model ignores some
    config = EngineConfig(max_model_len=1000, max_num_batched_tokens=1000)
    kept = SimJob(workload, config=config).run()
    streamed = SimJob(workload, config=config, stream_to=tmp_path).run()
    assert kept.summary["ignored"] > 0
    assert list(streamed.result.requests) == kept.result.requests


def test_a_driven_run_streams_too_and_equals_the_in_memory_run(tmp_path):
    """inference-perf's client aborts the requests it gives up on between steps, where no step reports them: the
    records, made from the groups the engine hands over, have them all the same (streamed, they used to be kept)."""
    config = yaml.safe_dump(
        {
            "data": {"type": "shared_prefix", "shared_prefix": {"num_groups": 3, "num_prompts_per_group": 4}},
            "load": {"type": "constant", "stages": [{"rate": 40, "duration": 2}], "request_timeout": 2.0},
        }
    )
    (tmp_path / "ip.yaml").write_text(config)
    tight = TIGHT.model_copy(update={"num_gpu_blocks": 120})
    kept, streamed = (
        SimJob(load_inference_perf(tmp_path / "ip.yaml"), config=tight, stream_to=to).run()
        for to in (None, tmp_path / "streamed")
    )
    assert kept.summary["aborted"] > 0  # the client timed some out
    assert isinstance(streamed.result.requests, RequestTable) and (tmp_path / "streamed" / "requests.parquet").exists()
    assert json.dumps(streamed.summary) == json.dumps(kept.summary) and streamed.lifecycle == kept.lifecycle
    assert list(streamed.result.requests) == kept.result.requests
    assert streamed.result.engine._groups == {} and streamed.result.engine.finished == []


def test_an_in_memory_log_gives_the_same_records_taken_at_every_step_or_at_the_end():
    """Taken from the engine as they end (a driven workload's log) or all at the end, the records are the groups'
    own, in the order they were added."""
    requests = build_workload(num_requests=120).requests()
    records = []
    for told in (False, True):
        engine = Engine(TIGHT, "vllm-default", SimulatedExecutor())
        log = RequestLog()
        take = log.taker(engine)
        engine.run(requests, on_step=take if told else None)
        assert (len(log.recorder.rows), len(engine.finished)) == ((120, 0) if told else (0, 120))
        take()
        records.append(log.close())
        assert engine.finished == [] and engine.sequence_groups == {}  # handed over
    assert records[0] == records[1] and [r.request_id for r in records[0]] == [f"req-{i}" for i in range(120)]


def test_row_groups_are_written_while_the_run_goes(tmp_path):
    engine = Engine(EngineConfig(), "vllm-default", SimulatedExecutor())
    log = RequestLog(tmp_path / "requests.parquet", row_group_size=25)
    take, seen = log.taker(engine), []

    def observe(report):
        take(report)
        seen.append((report.step, log.file.num_row_groups, len(log.file.rows)))

    engine.run(build_workload(num_requests=200).iter_requests(), on_step=observe, in_order=True)
    assert max(buffered for _, _, buffered in seen) < 25  # never more than one row group in memory
    halfway = seen[len(seen) // 2][1]
    assert 0 < halfway < 8  # some groups were already on disk halfway through
    assert not (tmp_path / "requests.parquet").exists() and (tmp_path / "requests.parquet.partial").exists()
    table = log.close()
    assert pq.ParquetFile(table.path).metadata.num_row_groups == 8 and len(table) == 200
    assert [r.request_id for r in table] == [f"req-{i}" for i in range(200)]
    assert not (tmp_path / "requests.parquet.partial").exists()


def live_groups() -> set[str]:
    gc.collect()
    return {o.request_id for o in gc.get_objects() if isinstance(o, SequenceGroup)}


@pytest.mark.filterwarnings("ignore::FutureWarning")  # gc's walk touches torch's deprecated lazy attributes
def test_an_engine_that_retains_no_finished_group_holds_only_unfinished_ones():
    engine = Engine(EngineConfig(), "vllm-default", SimulatedExecutor(), retain_finished=False)
    pulled, finished = [], []
    before = live_groups()

    def requests():
        for r in build_workload(num_requests=150).iter_requests():
            pulled.append(r.request_id)
            yield r

    def observe(report):
        s = engine.scheduler
        assert len(engine._groups) == len(s.waiting) + len(s.running) + len(s.swapped)
        assert len(pulled) <= engine.num_requests + 1  # requests are read as they arrive, one ahead at most
        finished.append([g.request_id for g in report.finished])

    assert engine.run(requests(), on_step=observe, in_order=True) == []
    assert engine._groups == {} and engine.finished == [] and engine.num_requests == 150 == sum(map(len, finished))
    # nothing keeps a finished group (nor its tokens) alive, but for the last step's, which its report still names
    assert live_groups() - before <= set(finished[-1])


def test_retaining_is_the_default_and_ids_stay_unique():
    engine = Engine(EngineConfig(), "vllm-default", SimulatedExecutor())
    done = engine.run(build_workload(num_requests=20).requests())
    assert len(done) == len(engine._groups) == 20 and engine.num_requests == 20
    with pytest.raises(ValueError, match="duplicate request id"):
        engine.add_request(Request(request_id="req-3", prompt_len=4, sampling=SamplingParams(max_tokens=2)))


def test_requests_in_order_must_be_in_order():
    engine = Engine(EngineConfig(), "vllm-default", SimulatedExecutor())
    late, early = (
        Request(request_id=i, prompt_len=8, arrival_time=t, output_len=2, sampling=SamplingParams(max_tokens=2))
        for i, t in (("late", 1.0), ("early", 0.5))
    )
    with pytest.raises(ValueError, match="'early' arrives before 'late'"):
        engine.run(iter([late, early]), in_order=True)


@given(st.lists(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), max_size=200))
def test_ordered_sum_adds_as_python_sum_does(values):
    assert ordered_sum(np.array(values, dtype=float)) == sum(values)
