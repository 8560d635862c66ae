"""The `engine` console script, end to end, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ENGINE = str(Path(sys.executable).with_name("engine"))


def engine(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([ENGINE, *args], capture_output=True, text=True, timeout=timeout)


def test_main_job_writes_a_clean_deterministic_summary(tmp_path):
    first = engine("--policy", "vllm-default", "--seed", "1", "--output", str(tmp_path / "a"), "-q")
    assert first.returncode == 0, first.stderr
    assert "leaked blocks" in first.stdout and "Traceback" not in first.stderr
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["leaked_blocks"] == 0
    assert summary["finished"] + summary["ignored"] == summary["num_requests"] == 400
    assert summary["preemptions"]["recompute"] > 0 and summary["preemptions"]["swap"] > 0
    assert summary["blocks_swapped_in"] == summary["blocks_swapped_out"] > 0
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        assert set(summary[key]) >= {"mean", "p50", "p90", "p99"}
        assert 0 < summary[key]["p50"] <= summary[key]["p99"]
    second = engine("--policy", "vllm-default", "--seed", "1", "--output", str(tmp_path / "b"), "-q")
    assert second.returncode == 0
    assert (tmp_path / "a" / "summary.json").read_bytes() == (tmp_path / "b" / "summary.json").read_bytes()
    rows = (tmp_path / "a" / "requests.csv").read_text().splitlines()
    assert len(rows) == 401 and rows[0].startswith("request_id,status")


def test_run_subcommand_takes_config_overrides(tmp_path):
    res = engine(
        "run",
        "-n",
        "60",
        "--set",
        "delay_factor=0.5",
        "--set",
        "max_num_batched_tokens=512",
        "--set",
        "max_num_seqs=64",
        "-o",
        str(tmp_path),
        "-q",
    )
    assert res.returncode == 0, res.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["num_requests"] == 60
    assert summary["config"]["delay_factor"] == 0.5 and summary["config"]["max_num_batched_tokens"] == 512


def test_unknown_policy_is_one_line_and_exit_2():
    res = engine("--policy", "nope")
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown policy 'nope'" in lines[0] and "vllm-default" in lines[0]


def test_invalid_config_value_names_the_field():
    res = engine("--set", "watermark=1.5")
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "watermark" in res.stderr and "Traceback" not in res.stderr
    res = engine("run", "--set", "no_such_knob=1")
    assert res.returncode == 2 and "no_such_knob" in res.stderr
    res = engine("run", "--set", "oops")
    assert res.returncode == 2 and "KEY=VALUE" in res.stderr


def test_policies_lists_the_reference_policy_with_its_distribution():
    res = engine("policies")
    assert res.returncode == 0
    line = next(x for x in res.stdout.splitlines() if "vllm-default" in x)
    assert "kvsched" in line
    assert res.stdout.splitlines()[-1].startswith("prefix-cache index: ")  # compiled, or which dict and why
