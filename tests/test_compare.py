"""``engine compare`` over several seeds: paired changes against a baseline, intervals that stay above zero,
ranks that say when they are resolved, policies under their own options, and a seed-independent workload run once."""

import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvsched.experiments.compare import Contender, PolicyRun, distinct_workloads, split_options, table
from kvsched.experiments.evidence import METRICS, Contest, change_text, choose_baseline
from kvsched.metrics.confidence import estimate, mean_interval, paired_change, rank_ranges, t_critical
from kvsched.workloads import build_workload

ENGINE = str(Path(sys.executable).parent / "engine")


@pytest.mark.parametrize("df, value", [(1, 12.706), (2, 4.303), (4, 2.776), (9, 2.262), (30, 2.042), (1000, 1.962)])
def test_t_critical_values_match_the_table(df, value):
    assert t_critical(df) == pytest.approx(value, abs=5e-4)


def test_mean_interval():
    assert mean_interval([2.0]) == (2.0, 0.0)
    mean, half = mean_interval([1.0, 2.0, 3.0])  # sd 1, n 3: 4.303 / sqrt(3)
    assert mean == 2.0 and half == pytest.approx(4.3027 / 3**0.5, rel=1e-4)


def test_a_paired_win_that_independent_intervals_call_overlapping():
    """The issue's case: each seed's TTFT varies far more between seeds than between policies, so the
    Student-t intervals of the two means overlap, yet the policy is faster on every seed."""
    baseline, policy = [0.9, 2.8, 5.1], [0.6, 1.8, 3.3]
    (mb, hb), (mp, hp) = mean_interval(baseline), mean_interval(policy)
    assert mp + hp > mb - hb  # the old test: overlapping, "not a win"
    change = paired_change(policy, baseline)
    assert change.kind == "ratio" and change.significant and change.better(lower_is_better=True)
    assert change.value == pytest.approx(math.exp(sum(math.log(p / b) for p, b in zip(policy, baseline)) / 3))
    assert change_text(change, METRICS["ttft_mean_s"]).endswith("*")


def test_the_old_interval_went_below_zero_and_the_new_one_does_not():
    values = [0.2, 0.3, 6.0]  # one slow seed: a latency's spread
    mean, half = mean_interval(values)
    assert mean - half < 0  # the Student-t interval of a latency that cannot be negative
    e = estimate(values)
    assert 0 < e.low < e.mean < e.high and e.mean == pytest.approx(mean)


@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=12))
def test_an_estimate_of_non_negative_values_stays_non_negative(values):
    e = estimate(values)
    assert 0 <= e.low <= e.mean * (1 + 1e-12) and e.mean <= e.high * (1 + 1e-12) and e.n == len(values)


@given(st.lists(st.tuples(st.floats(1e-3, 1e4), st.floats(1e-3, 1e4)), min_size=2, max_size=10))
def test_a_ratio_interval_stays_above_minus_100_percent_and_holds_its_estimate(pairs):
    change = paired_change([a for a, _ in pairs], [b for _, b in pairs])
    assert (
        change.kind == "ratio"
        and 0 < change.low <= change.value * (1 + 1e-9)
        and change.value <= change.high * (1 + 1e-9)
    )
    swapped = paired_change([b for _, b in pairs], [a for a, _ in pairs])
    assert swapped.value == pytest.approx(1 / change.value, rel=1e-9) and swapped.significant == change.significant


def test_a_value_that_can_be_zero_is_compared_by_its_difference():
    change = paired_change([0.0, 2.0, 4.0], [1.0, 3.0, 5.0])  # a recompute tax, a count of preemptions
    assert (
        change.kind == "difference"
        and change.value == -1.0
        and change.low == change.high == -1.0
        and change.significant
    )
    assert change_text(change, METRICS["recompute_tax"]) == "-100.0 pp (-100.0 pp to -100.0 pp)*"
    assert change_text(paired_change([3.0], [3.0]), METRICS["ttft_mean_s"]) == "same"
    assert change_text(paired_change([2.0], [4.0]), METRICS["ttft_mean_s"]) == "-50% (one run)"


@given(st.dictionaries(st.sampled_from("abcdef"), st.lists(st.floats(0.01, 100), min_size=3, max_size=3), min_size=1))
def test_rank_ranges_hold_every_order_the_paired_tests_allow(samples):
    ranges = rank_ranges(samples)
    n = len(samples)
    for best, worst in ranges.values():
        assert 1 <= best <= worst <= n
    resolved = sorted(best for best, worst in ranges.values() if best == worst)
    assert len(resolved) == len(set(resolved))  # no two contenders hold the same resolved rank


def test_ranks_are_resolved_only_where_the_paired_differences_say_so():
    samples = {"fast": [1.0, 2.0, 3.0], "slow": [2.0, 4.1, 6.0], "noisy": [0.5, 5.0, 2.0]}
    ranges = rank_ranges(samples)
    assert ranges["fast"] == (1, 2) and ranges["slow"] == (2, 3) and ranges["noisy"] == (1, 3)
    assert rank_ranges({"a": [1.0, 2.0], "b": None}) == {"a": (1, 1), "b": (2, 2)}


def _summary(rate: float, ttft: float = 0.5, tax: float = 0.1) -> dict:
    latency = {"mean": ttft, "p50": 0.4, "p90": 0.8, "p99": 0.9}
    return {
        "num_requests": 12,
        "finished": 10,
        "ignored": 2,
        "aborted": 0,
        "requests_per_s": rate,
        "throughput_tokens_per_s": 100.0,
        "ttft_s": latency,
        "tpot_s": latency,
        "e2e_s": latency,
        "preemptions": {"recompute": 1, "swap": 2},
        "recompute": {"tax": tax},
        "warnings": [{"count": 2, "reason": "ignored: too long"}],
    }


def test_the_table_has_intervals_changes_ranks_and_the_unserved_rows():
    runs = [
        PolicyRun("base", [_summary(v, ttft=t) for v, t in ((1.0, 1.0), (2.0, 2.0), (3.0, 3.0))]),
        PolicyRun("fast", [_summary(v, ttft=t) for v, t in ((1.0, 0.5), (2.0, 1.1), (3.0, 1.4))]),
    ]
    head, rows = table(runs, "base")
    assert head == ["metric", "base", "fast", "fast vs base"]
    rows = {r[0]: r[1:] for r in rows}
    assert rows["rank by TTFT mean (s)"] == ["2", "1", ""]
    assert rows["TTFT mean (s)"][2].endswith("*") and rows["TTFT mean (s)"][2].startswith("-5")
    assert (
        rows["ignored"][0] == "2 (2–2)"
        and rows["not served (%)"][0] == "16.7 (16.7–16.7)"
        and rows["ignored"][2] == "same"
    )
    assert rows["recompute tax (%)"][0] == "10.0 (10.0–10.0)" and rows["warnings"] == ["1", "1", ""]
    assert rows["throughput (req/s)"][0] == "2.000 (0.578–6.926)"  # 2 · exp(±2.484 / 2): never below zero
    assert "prefix hits (%)" not in rows  # a single engine reports none


def test_policies_under_their_own_options_and_the_baseline():
    assert Contender.parse("lcf") == Contender("lcf", "lcf", {})
    assert Contender.parse("lcf:victim=mcf,seed=2") == Contender(
        "lcf:victim=mcf,seed=2", "lcf", {"victim": "mcf", "seed": "2"}
    )
    assert Contender.parse("ewsjf:edges=256,1024,sjf_weight=2").options == {"edges": "256,1024", "sjf_weight": "2"}
    assert Contender.parse("my.policy.py:Draft").spec == "my.policy.py:Draft"
    assert Contender.parse("my.policy.py:Draft:window=4") == Contender(
        "my.policy.py:Draft:window=4", "my.policy.py:Draft", {"window": "4"}
    )
    assert Contender.parse("lcf:victim=mcf").label("lcf") == "lcf:victim=mcf"
    with pytest.raises(ValueError, match="given twice"):
        Contender.parse("lcf:seed=1,seed=2")
    assert choose_baseline(["lcf", "vllm-v1"], None) == "vllm-v1" and choose_baseline(["lcf", "hrrn"], None) == "lcf"
    with pytest.raises(ValueError, match="--baseline 'fcfs' is not one of"):
        choose_baseline(["lcf", "hrrn"], "fcfs")


def test_policy_opt_names_a_file_policy_whole():
    """It split a file policy's path at its first dot (``my.py:Draft.window`` became policy ``my``)."""
    assert split_options({"drafts/my.py:Draft.window": "4", "lcf.victim": "mcf"}, ["drafts/my.py:Draft", "lcf"]) == {
        "drafts/my.py:Draft": {"window": "4"},
        "lcf": {"victim": "mcf"},
    }
    with pytest.raises(ValueError, match="POLICY.KEY=VALUE"):
        split_options({"fcfs.x": "1"}, ["lcf"])


def test_a_contest_pools_units_in_order():
    game = Contest(
        {"a": [{"ttft_mean_s": 1.0}, {"ttft_mean_s": 2.0}], "b": [{"ttft_mean_s": 0.5}, {"ttft_mean_s": None}]}, "a"
    )
    assert game.values("b", METRICS["ttft_mean_s"]) is None and game.change("b", METRICS["ttft_mean_s"]) is None
    assert game.ranks(METRICS["ttft_mean_s"]) == {"a": (1, 1), "b": (2, 2)}


def test_a_trace_replay_does_not_depend_on_the_seed():
    assert len(distinct_workloads([build_workload("azure-conv", num_requests=50, seed=s) for s in range(3)])) == 1
    assert len(distinct_workloads([build_workload(None, num_requests=50, seed=s) for s in range(3)])) == 3


def test_engine_compare_over_seeds_one_policy_under_two_option_sets(tmp_path):
    proc = subprocess.run(
        [
            ENGINE,
            "compare",
            "--policy",
            "lcf",
            "--policy",
            "lcf:victim=mcf",
            "--policy",
            "fcfs",
            "-n",
            "40",
            "--seeds",
            "2",
            "--baseline",
            "fcfs",
            "-o",
            tmp_path / "cmp",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    head = next(line for line in lines if "lcf vs fcfs" in line)
    assert "lcf:victim=mcf vs fcfs" in head and "seeds 0–1, mean (95% interval)" in proc.stdout
    assert "baseline fcfs." in proc.stdout and "paired" in proc.stdout
    assert any(line.startswith("│ rank by TTFT mean (s)") for line in lines) and any(
        line.startswith("│ recompute tax (%)") for line in lines
    )
    header = (tmp_path / "cmp" / "comparison.csv").read_text().splitlines()[0]
    assert header == "metric,lcf,lcf vs fcfs,lcf:victim=mcf,lcf:victim=mcf vs fcfs,fcfs"


def test_compare_puts_result_folders_side_by_side(tmp_path):
    engine = Path(sys.executable).with_name("engine")
    for policy, options in (("fcfs", []), ("sjf", ["--policy-opt", "predictor=oracle"])):
        subprocess.run(
            [engine, "run", "--policy", policy, *options, "-n", "60", "--rate", "40", "-o", tmp_path / policy, "-q"],
            check=True,
            capture_output=True,
        )
    done = subprocess.run(
        [engine, "compare", tmp_path / "fcfs", tmp_path / "sjf", "-o", tmp_path / "cmp", "--plot"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "fcfs (fcfs)" in done.stdout and "sjf (sjf) vs fcfs (fcfs)" in done.stdout and "(one run)" in done.stdout
    assert (tmp_path / "cmp" / "comparison_cdf.png").stat().st_size > 10_000
    missing = subprocess.run(
        [engine, "compare", tmp_path / "fcfs", tmp_path / "nowhere"], capture_output=True, text=True
    )
    assert missing.returncode == 2 and "has no summary.json" in missing.stderr and "Traceback" not in missing.stderr
    refused = subprocess.run(
        [engine, "compare", tmp_path / "fcfs", tmp_path / "sjf", "--seeds", "5"], capture_output=True, text=True
    )
    assert refused.returncode == 2 and "drop --seeds" in refused.stderr
