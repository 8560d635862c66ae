"""``engine capacity``: the highest load within an SLO, found by bracketing and bisection on each seed, compared
with the paired statistics; its files, its plot, routers in front of a fleet, and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvsched.experiments.capacity import CAPACITY, MAX_DOUBLINGS, Load, parse_slo, run_capacity, search, within

ENGINE = str(Path(sys.executable).parent / "engine")


def _step(limit: float):
    """A contender within the SLO up to ``limit`` times the workload's rate of 2 req/s."""
    return lambda scale: Load(scale, 2 * scale, scale <= limit, min(scale, limit))


@pytest.mark.parametrize("limit", [0.01, 0.37, 1.0, 3.3, 50.0])
def test_the_search_finds_the_edge_within_its_tolerance(limit):
    found = search(_step(limit), tolerance=0.05)
    assert 2 * limit / 1.05 <= found.capacity <= 2 * limit
    assert len(found.loads) <= 2 * MAX_DOUBLINGS  # a bracket, then a bisection


def test_a_load_never_within_is_no_capacity_and_one_always_within_stops_at_the_largest_tried():
    assert search(_step(0.0)).capacity == 0.0 and len(search(_step(0.0)).loads) == MAX_DOUBLINGS + 1
    assert search(_step(1e9)).capacity == 2 * 2**MAX_DOUBLINGS


def test_capacities_are_compared_paired_over_the_seeds():
    limits = {
        "base": [1.0, 2.0, 4.0],
        "better": [1.3, 2.6, 5.1],
    }  # each seed its own level; better by 30 % on every one
    searches, contest = run_capacity(
        list(limits), [0, 1, 2], lambda c, s, scale: _step(limits[c][s])(scale), "base", tolerance=0.01
    )
    change = contest.change("better", CAPACITY)
    assert change.significant and change.better(lower_is_better=False) and change.value == pytest.approx(1.3, rel=0.02)
    assert contest.ranks(CAPACITY) == {"better": (1, 1), "base": (2, 2)}
    assert [s.capacity for s in searches["base"]] == pytest.approx([2.0, 4.0, 8.0], rel=0.01)


def test_the_slo_is_parsed_and_judged():
    assert parse_slo(["ttft_p99=2,tpot_p99=0.1", "e2e_p50=30"]) == {
        "ttft_p99_s": 2.0,
        "tpot_p99_s": 0.1,
        "e2e_p50_s": 30.0,
    }
    for bad, message in (
        (["ttft_p42=2"], "NAME one of"),
        (["ttft_p99=fast"], "not a number"),
        (["ttft_p99=0"], "positive"),
        (["ttft_p99=1,ttft_p99=2"], "given twice"),
        ([""], "at least one bound"),
    ):
        with pytest.raises(ValueError, match=message):
            parse_slo(bad)
    summary = {"num_requests": 3, "finished": 3, "ignored": 0, "aborted": 0, "ttft_s": {"p99": 1.5}}
    assert within(summary, {"ttft_p99_s": 2.0}) and not within(summary, {"ttft_p99_s": 1.0})
    assert not within({**summary, "aborted": 1}, {"ttft_p99_s": 2.0}) and not within(
        summary, {"tpot_p99_s": 1.0}
    )  # no TPOT: not met


def test_engine_capacity_end_to_end(tmp_path):
    done = subprocess.run(
        [
            ENGINE,
            "capacity",
            "-p",
            "vllm-v1",
            "-p",
            "lcf",
            "-w",
            "synthetic",
            "-n",
            "40",
            "--rate",
            "10",
            "--slo",
            "ttft_p99=0.5",
            "--seeds",
            "2",
            "--tolerance",
            "0.2",
            "-o",
            tmp_path / "cap",
            "--plot",
            "-q",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert "capacity within ttft_p99 ≤ 0.5 s · seeds 0–1" in done.stdout and "baseline vllm-v1." in done.stdout
    doc = json.loads((tmp_path / "cap" / "capacity.json").read_text())
    assert doc["slo"] == {"ttft_p99_s": 0.5} and doc["seeds"] == [0, 1] and doc["command"].startswith("engine capacity")
    for runs in doc["searches"].values():
        for run in runs:
            assert run["capacity_req_per_s"] == max((x["offered"] for x in run["loads"] if x["within"]), default=0.0)
            assert all(not x["within"] for x in run["loads"] if x["offered"] > run["capacity_req_per_s"])
    assert (tmp_path / "cap" / "capacity.png").stat().st_size > 10_000 and "| vllm-v1 |" in (
        tmp_path / "cap" / "capacity.md"
    ).read_text()


def test_engine_capacity_sizes_routers_in_front_of_a_fleet(tmp_path):
    done = subprocess.run(
        [
            ENGINE,
            "capacity",
            "--router",
            "round-robin",
            "--router",
            "least-outstanding",
            "--replicas",
            "2",
            "-w",
            "synthetic",
            "-n",
            "30",
            "--rate",
            "20",
            "--slo",
            "ttft_p99=0.5",
            "--seeds",
            "1",
            "--tolerance",
            "0.3",
            "-q",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert (
        "2 replicas of vllm-v1" in done.stdout
        and "│ least-outstanding" in done.stdout
        and "vs round-robin" in done.stdout
    )
    assert "seed 0 (one run a contender)" in done.stdout


def test_bad_input_is_one_line_before_any_run(tmp_path):
    for args, message in (
        (["-p", "vllm-v1", "--slo", "ttft=1"], "NAME one of"),
        (["-p", "vllm-v1", "--slo", "ttft_p99=1", "--replicas", "2"], "--replicas describe the fleet"),
        (["-p", "vllm-v1", "--slo", "ttft_p99=1", "--plot"], "--plot needs --output"),
        (["--slo", "ttft_p99=1"], "give the policies"),
        (["-p", "no-such", "--slo", "ttft_p99=1"], "no-such"),
    ):
        done = subprocess.run([ENGINE, "capacity", *args, "-q"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1, (
            args,
            done.stderr,
        )
