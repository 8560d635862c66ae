"""Per-class results (metrics/classes.py): each SLO class, tenant and priority, and the sessions, in summary.json
(in memory and streamed alike), the printed summary, engine compare, engine bench and report.html."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kvsched.experiments.compare import PolicyRun, table
from kvsched.experiments.simulation import SimJob
from kvsched.metrics.classes import class_summary, class_table
from kvsched.metrics.records import records_table
from kvsched.workloads import build_workload

ENGINE = str(Path(sys.executable).parent / "engine")


@pytest.fixture(scope="module")
def tiered():
    return SimJob(build_workload("tiered-sessions", num_requests=40), "sla-tiers", record_timeseries=False).run()


def test_each_class_is_its_requests_alone(tiered):
    records = tiered.result.requests
    classes = tiered.summary["classes"]
    assert set(classes) == {"slo_class", "session"}  # one tenant and one priority: no breakdown of either
    assert sum(c["requests"] for c in classes["slo_class"].values()) == len(records)
    for name, c in classes["slo_class"].items():
        mine = [
            r for r in records if r.slo_class == name and r.status in ("FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED")
        ]
        assert c["finished"] == len(mine) and c["ttft_s"]["mean"] == pytest.approx(np.mean([r.ttft for r in mine]))
    sessions = {r.session_id for r in records}
    means = [np.mean([r.ttft for r in records if r.session_id == s]) for s in sessions]
    assert classes["session"]["sessions"] == len(sessions) == 40
    assert classes["session"]["mean_ttft_s"]["p99"] == pytest.approx(np.percentile(means, 99))


def test_a_streamed_run_has_the_same_classes(tiered, tmp_path):
    streamed = SimJob(
        build_workload("tiered-sessions", num_requests=40), "sla-tiers", record_timeseries=False, stream_to=tmp_path
    ).run()
    assert streamed.summary["classes"] == tiered.summary["classes"]


def test_a_run_of_one_class_has_none_and_many_values_are_not_classes():
    plain = SimJob(build_workload(None, num_requests=40), "fcfs", record_timeseries=False).run()
    assert plain.summary["classes"] == {} and class_table(plain.summary)[1] == []
    records = plain.result.requests
    from dataclasses import replace

    spread = [replace(r, priority=i, tenant=f"t{i % 2}") for i, r in enumerate(records)]  # 40 priorities: too many
    assert set(class_summary(records_table(spread))) == {"tenant"}


def test_compare_has_a_row_per_class_with_its_paired_change(tiered):
    base = PolicyRun("vllm-v1", [tiered.summary, tiered.summary])
    head, rows = table([base, PolicyRun("same", [tiered.summary, tiered.summary])], "vllm-v1")
    labels = [r[0] for r in rows]
    assert "TTFT mean · slo_class=interactive (s)" in labels and "TTFT p99 · a session's mean (s)" in labels
    assert rows[labels.index("TTFT mean · slo_class=interactive (s)")][3] == "same"


def test_the_printed_summary_and_the_report_show_the_classes(tmp_path):
    done = subprocess.run(
        [ENGINE, "run", "-p", "sla-tiers", "-w", "tiered-sessions", "-n", "12", "-o", tmp_path / "out", "--plot"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert (
        "per class" in done.stdout
        and "slo_class interactive" in done.stdout
        and "12 sessions: a session's mean TTFT" in done.stdout
    )
    assert 'id="classes"' in (tmp_path / "out" / "report.html").read_text()
    assert "slo_class" in json.loads((tmp_path / "out" / "summary.json").read_text())["classes"]
