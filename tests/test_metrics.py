"""Metrics against values computed by hand on a three-request workload with one-second steps.

Timeline (vllm-default, every non-empty step costs exactly 1 s, block size 4):
  step 0 (0→1 s): prefill r0 (a: 4 prompt, 3 out), r1 (b: 4, 2) and r2 (a: 8, 1); r2 ends (1 token)
  step 1 (1→2 s): decode r0, r1; r1 ends
  step 2 (2→3 s): decode r0; r0 ends
"""

import dataclasses
import json
import math

import pandas as pd
import pytest

from kvsched.core.config import EngineConfig
from kvsched.executors.cost_model import CostProfile
from kvsched.experiments.simulation import SimJob
from kvsched.metrics.fairness import jain_index
from kvsched.reporting.files import write_outputs
from kvsched.workloads import TraceWorkload

UNIT = CostProfile(
    name="unit-second",
    base_ms=1000,
    prefill_token_ms=0,
    decode_seq_ms=0,
    kv_token_ms=0,
    kv_bytes_per_token=0,
    swap_gb_per_s=1,
    copy_gb_per_s=1,
)
CONFIG = EngineConfig(
    block_size=4, num_gpu_blocks=64, num_cpu_blocks=16, watermark=0.0, max_num_batched_tokens=256, max_num_seqs=16
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("wl") / "tiny.csv"
    path.write_text("arrival_time_s,prompt_tokens,output_tokens,priority,tenant\n0,4,3,0,a\n0,4,2,0,b\n0,8,1,0,a\n")
    return SimJob(TraceWorkload(path=path), config=CONFIG, profile=UNIT, slo_ttft=1.0, slo_tpot=0.9)


@pytest.fixture(scope="module")
def outcome(tiny):
    return tiny.run()


def test_per_request_metrics(outcome):
    m = {r.request_id: r for r in outcome.result.requests}
    assert [(m[i].ttft, m[i].tpot, m[i].e2e, m[i].queueing_time) for i in ("req-0", "req-1", "req-2")] == [
        (1.0, 1.0, 3.0, 0.0),
        (1.0, 1.0, 2.0, 0.0),
        (1.0, None, 1.0, 0.0),
    ]
    assert [m[i].finish_time for i in ("req-0", "req-1", "req-2")] == [3.0, 2.0, 1.0]
    assert {m[i].finish_reason for i in m} == {"stop"} and sum(m[i].output_tokens for i in m) == 6


def test_aggregates(outcome):
    s = outcome.summary
    assert (s["duration_s"], s["finished"], s["steps"]) == (3.0, 3, 3)
    assert s["requests_per_s"] == pytest.approx(1.0) and s["throughput_tokens_per_s"] == pytest.approx(2.0)
    assert s["e2e_s"] == pytest.approx({"mean": 2.0, "p50": 2.0, "p90": 2.8, "p99": 2.98})
    assert s["tpot_s"]["mean"] == 1.0  # r2 has no TPOT (one token)
    assert s["profile"] == "unit-second"


def test_slo_goodput(outcome):
    slo = outcome.summary["slo"]  # TTFT <= 1 s and TPOT <= 0.9 s: only r2 (no TPOT) meets both
    assert slo["requests_meeting_slo"] == 1
    assert slo["slo_attainment"] == pytest.approx(1 / 3)
    assert slo["goodput_requests_per_s"] == pytest.approx(1 / 3) and slo["goodput_tokens_per_s"] == pytest.approx(1 / 3)


def test_fairness(outcome):
    f = outcome.summary["fairness"]
    # service: a = 4 + 8 (prefill) + 2 + 2 (two decodes of r0) = 16; b = 4 + 2 = 6
    assert {t: v["service"] for t, v in f["tenants"].items()} == {"a": 16, "b": 6}
    # Both tenants have requests waiting only at the start of step 0 (1 s): a gets 12 prefill
    # tokens of service then, b 4. Backlogged rates 12/s and 4/s: Jain = 16² / (2·(12² + 4²)).
    assert {t: v["backlogged_service_rate"] for t, v in f["tenants"].items()} == {"a": 12.0, "b": 4.0}
    assert f["jain_index"] == pytest.approx(0.8)
    assert f["max_service_gap"] == 8 and f["max_service_gap_time_s"] == 1.0  # counters 12 vs 4 in that step
    assert jain_index([5, 5, 5]) == 1.0 and jain_index([1, 0, 0, 0]) == 0.25


def test_time_series(outcome):
    ts = outcome.timeseries.frame()
    assert ts.time_s.tolist() == [1.0, 2.0, 3.0]
    assert ts.prefill_tokens.tolist() == [16, 0, 0] and ts.decode_seqs.tolist() == [0, 2, 1]
    assert ts.batch_seqs.tolist() == [3, 2, 1] and ts.num_running.tolist() == [2, 1, 0]
    # after each step: r0 and r1 hold a block each; both grow to two blocks, r1 frees its two; all free
    assert ts.gpu_blocks_used.tolist() == [2, 2, 0]
    assert ts.finished.tolist() == [1, 1, 1]
    kv = outcome.summary["kv_usage"]  # time-weighted over three one-second steps
    assert (kv["gpu_blocks_peak"], kv["cpu_blocks_peak"], kv["waiting_peak"]) == (2, 0, 0)
    assert kv["gpu_utilization_mean"] == pytest.approx((2 + 2 + 0) / 3 / 64)
    assert kv["batch_seqs_mean"] == pytest.approx((3 + 2 + 1) / 3)


def test_output_files(tiny, tmp_path):
    outcome = dataclasses.replace(tiny, decision_log=tmp_path / "decisions.parquet").run()
    paths = {p.name for p in write_outputs(outcome, tmp_path, plot=True)}
    assert {
        "summary.json",
        "requests.csv",
        "requests.parquet",
        "timeseries.parquet",
        "decisions.parquet",
        "trace.json",
        "report.html",
        "latency_cdf.png",
        "queues_kv.png",
        "batch_composition.png",
    } <= paths
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["slo"]["requests_meeting_slo"] == 1 and summary["workload"]["kind"] == "trace"
    req = pd.read_parquet(tmp_path / "requests.parquet")
    assert req.set_index("request_id").e2e.to_dict() == {"req-0": 3.0, "req-1": 2.0, "req-2": 1.0}
    assert math.isnan(req.set_index("request_id").tpot["req-2"])
    assert len(pd.read_parquet(tmp_path / "timeseries.parquet")) == 3
    html = (tmp_path / "report.html").read_text()
    assert "<script src" not in html and "<link" not in html  # one file: Plotly's JavaScript is inlined
    assert html.count('class="chart"') == 9 and html.count('class="caption"') >= 9


def test_fairness_metrics_tell_vtc_from_fcfs():
    """Under overload, a heavy tenant crowds out a light one with FCFS; VTC serves both at the same rate."""
    from kvsched.workloads import Poisson, SyntheticSpec
    from kvsched.workloads.distributions import LogNormal

    spec = SyntheticSpec(
        num_requests=600,
        arrivals=Poisson(rate=30.0),
        tenants={"heavy": 0.8, "light": 0.2},
        prompt=LogNormal(median=400, sigma=0.6, max=1500),
        output=LogNormal(median=100, sigma=0.6, max=300),
        seed=2,
    )
    fair = {
        pol: SimJob(spec, pol, EngineConfig(num_gpu_blocks=1500, max_num_seqs=32), record_timeseries=False)
        .run()
        .summary["fairness"]
        for pol in ("fcfs", "vtc")
    }
    assert fair["vtc"]["jain_index"] > 0.9 > 0.8 > fair["fcfs"]["jain_index"]
    assert fair["vtc"]["max_service_gap"] * 20 < fair["fcfs"]["max_service_gap"]


def test_a_request_row_holds_each_field_under_its_own_name():
    """``request_row`` writes a record's values by position, in ``FIELDS`` order: each read back by name is the group's
    own (under KV pressure, so that requests are preempted, and with ``n`` > 1), and ``RequestMetrics.of`` agrees."""
    from kvsched import Engine, SimulatedExecutor
    from kvsched.core.request import Request, SamplingParams
    from kvsched.metrics.requests import FIELDS, RequestMetrics, request_row

    config = EngineConfig(num_gpu_blocks=24, block_size=16, max_num_batched_tokens=512)
    engine = Engine(config, "vllm-default", SimulatedExecutor())
    requests = [
        Request(
            request_id=f"r{i}",
            prompt_len=60 + 9 * i,
            output_len=30 + i,
            arrival_time=0.01 * i,
            tenant=f"t{i % 2}",
            priority=i % 3,
            sampling=SamplingParams(max_tokens=30 + i, n=2 if i == 3 else 1),
        )
        for i in range(8)
    ]
    groups = engine.run(requests)
    assert sum(g.num_recompute_preemptions + g.num_swap_preemptions for g in groups) > 0
    for g in groups:
        row = dict(zip(FIELDS, request_row(g), strict=True))
        assert row == dataclasses.asdict(RequestMetrics.of(g))
        longest = max(len(s.output) for s in g.seqs)
        assert (row["request_id"], row["status"], row["tenant"], row["priority"]) == (
            g.request_id,
            g.status.name,
            g.request.tenant,
            g.request.priority,
        )
        assert (row["n"], row["prompt_tokens"], row["output_tokens"]) == (
            g.request.sampling.n,
            g.request.prompt_len,
            g.num_generated_tokens,
        )
        assert row["ttft"] == g.first_token_time - g.arrival_time
        assert row["queueing_time"] == g.first_scheduled_time - g.arrival_time
        assert row["e2e"] == g.finish_time - g.arrival_time
        assert row["tpot"] == (g.finish_time - g.first_token_time) / (longest - 1)
        assert (row["preemptions_recompute"], row["preemptions_swap"]) == (
            g.num_recompute_preemptions,
            g.num_swap_preemptions,
        )
        computed = g.num_discarded_tokens + sum(s.num_computed_tokens for s in g.seqs) - g.num_prefix_hit_tokens
        assert (row["recomputed_tokens"], row["discarded_tokens"], row["computed_tokens"]) == (
            g.num_recomputed_tokens,
            g.num_discarded_tokens,
            computed,
        )
