"""Warnings where results are not what they seem: ignored and aborted requests, a queue that never drained."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvsched.core.config import EngineConfig
from kvsched.executors.cost_model import CostProfile
from kvsched.experiments.simulation import SimJob
from kvsched.metrics.records import records_table
from kvsched.metrics.requests import RequestMetrics
from kvsched.metrics.warnings import run_warnings
from kvsched.reporting.files import write_outputs
from kvsched.workloads import TraceWorkload

ENGINE = str(Path(sys.executable).parent / "engine")
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


def record(
    i: int, arrival: float, scheduled: float | None, status: str = "FINISHED_STOPPED", detail: str | None = None
):
    return RequestMetrics(
        request_id=f"r{i}",
        status=status,
        finish_reason=None,
        detail=detail,
        priority=0,
        tenant="t",
        n=1,
        prompt_tokens=10,
        output_tokens=1,
        arrival_time=arrival,
        first_scheduled_time=scheduled,
        first_token_time=scheduled,
        finish_time=(scheduled if scheduled is not None else arrival) + 1,
        queueing_time=None,
        ttft=None,
        tpot=None,
        e2e=None,
        preemptions_recompute=0,
        preemptions_swap=0,
    )


def test_unserved_requests_are_counted_by_reason_with_the_range_of_what_varies():
    records = [
        record(0, 0, None, "FINISHED_IGNORED", "5000 tokens exceed max_model_len (4096)"),
        record(1, 1, None, "FINISHED_IGNORED", "4200 tokens exceed max_model_len (4096)"),
        record(2, 2, None, "FINISHED_IGNORED", "n=8 sequences exceed max_num_seqs (4)"),
        record(3, 3, None, "FINISHED_ABORTED"),
        record(4, 4, None, "FINISHED_ABORTED", "HTTP 500 {'error': 'boom'}"),
        record(5, 5, 5.0),
    ]
    assert run_warnings(records_table(records)) == [
        {"count": 2, "reason": "ignored: 4,200–5,000 tokens exceed max_model_len (4096)"},
        {"count": 1, "reason": "ignored: n=8 sequences exceed max_num_seqs (4)"},
        {"count": 1, "reason": "aborted: no reason recorded"},
        {"count": 1, "reason": "aborted: HTTP 500 {'error': 'boom'}"},
    ]


def test_a_queue_that_never_drains_is_an_overload_and_one_that_drains_is_not():
    # served one per second, arriving two per second: from the first arrival on, someone always waits
    overloaded = [record(i, i / 2, float(i)) for i in range(40)]
    (warning,) = run_warnings(records_table(overloaded))
    assert (
        warning["count"] == 39
        and "waiting queue last emptied, 0.0 s into 19.5 s of arrivals (overload)" in warning["reason"]
    )
    # a burst that is served before the next one: the queue empties between bursts
    bursts = [record(i, 10 * (i // 4), 10 * (i // 4) + i % 4) for i in range(40)]
    assert run_warnings(records_table(bursts)) == []
    # a client sees no scheduling: nothing is said about the queue
    unseen = [record(i, i / 2, None) for i in range(40)]
    assert run_warnings(records_table(unseen)) == []


@pytest.fixture(scope="module")
def overloaded_run(tmp_path_factory):
    """One-second steps, one request at a time, two arrivals a second, and one prompt too long for the model."""
    folder = tmp_path_factory.mktemp("overload")
    trace = folder / "t.csv"
    trace.write_text(
        "arrival_time_s,prompt_tokens,output_tokens\n"
        + "".join(f"{i / 2},{300 if i == 3 else 8},2\n" for i in range(30))
    )
    config = EngineConfig(
        block_size=4, num_gpu_blocks=64, max_num_seqs=1, max_num_batched_tokens=256, max_model_len=256
    )
    return folder, SimJob(
        TraceWorkload(path=trace), config=config, profile=UNIT, decision_log=folder / "decisions.parquet"
    ).run()


def test_the_summary_lists_the_warnings_and_no_slo_without_a_target(overloaded_run):
    _, outcome = overloaded_run
    s = outcome.summary
    assert s["slo"] is None
    reasons = [(w["count"], w["reason"].split(":")[0]) for w in s["warnings"]]
    assert reasons[0] == (1, "ignored") and reasons[1][1].startswith("arrived after the waiting queue last emptied")


def test_the_report_shows_the_warnings_above_its_table(overloaded_run):
    folder, outcome = overloaded_run
    write_outputs(outcome, folder / "out", plot=True)
    html = (folder / "out" / "report.html").read_text()
    box = html.index('id="warnings"')
    assert box < html.index("<th>metric</th>")
    assert "1 of 30 requests ignored: 300 tokens exceed max_model_len (256)" in html[box:]
    assert "goodput" not in html.split('id="chart-specs"')[0].split("<h2>summary.json")[0]
    assert json.loads((folder / "out" / "summary.json").read_text())["warnings"] == outcome.summary["warnings"]


def test_the_terminal_summary_ends_with_the_warnings_and_shows_goodput_only_for_a_target(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_time_s,prompt_tokens,output_tokens\n0,100,5\n0,9000,5\n")
    proc = subprocess.run([ENGINE, "run", "--trace", trace, "-q"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    table_end = proc.stdout.index("└")
    assert proc.stdout.index("warning: 1 of 2 requests ignored: 9,000 tokens exceed max_model_len (4096)") > table_end
    assert "SLO goodput" not in proc.stdout
    proc = subprocess.run(
        [ENGINE, "run", "--trace", trace, "-q", "--slo-ttft", "1"], capture_output=True, text=True, timeout=300
    )
    assert "SLO goodput" in proc.stdout
