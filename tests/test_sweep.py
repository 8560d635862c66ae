"""Sweeps: grid parsing, parallel = sequential results, the table and the trade-off plot, a worker's failure."""

import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from worker_policies import FAILING

from kvsched.experiments.sweep import Point, SweepSpec, grid_points, parse_grid, run_sweep
from kvsched.reporting.files import write_sweep


@pytest.fixture
def tiny_trace(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text(
        "arrival_time_s,prompt_tokens,output_tokens\n"
        + "".join(f"{i * 0.05:.2f},{200 + 37 * i % 300},{20 + 7 * i % 40}\n" for i in range(60))
    )
    return p


def test_grid_parsing_and_points():
    grid = parse_grid(["delay_factor=0,0.5,1,2", "max_num_batched_tokens=512, 2048"])
    assert grid == {"delay_factor": ["0", "0.5", "1", "2"], "max_num_batched_tokens": ["512", "2048"]}
    points = grid_points(["vllm-default", "other"], grid)
    assert len(points) == 16 and points[0] == Point(
        "vllm-default", {"delay_factor": "0", "max_num_batched_tokens": "512"}
    )
    assert points[-1].label == "other delay_factor=2 max_num_batched_tokens=2048"
    with pytest.raises(ValueError, match="unknown engine setting 'delay'"):
        parse_grid(["delay=1"])
    with pytest.raises(ValueError, match="KEY=V1,V2"):
        parse_grid(["delay_factor"])


def test_sweep_rows_parallel_equal_sequential(tiny_trace, tmp_path):
    spec = SweepSpec({"trace": tiny_trace}, {"num_gpu_blocks": "256"}, slo_ttft=0.5)
    points = grid_points(["vllm-default"], parse_grid(["max_num_batched_tokens=512,2048", "max_num_seqs=4,64"]))
    seq = run_sweep(spec, points, workers=1)
    par = run_sweep(spec, points, workers=2)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]  # noqa: E731
    assert strip(seq) == strip(par)
    assert [(r["max_num_batched_tokens"], r["max_num_seqs"]) for r in seq] == [
        (512, 4),
        (512, 64),
        (2048, 4),
        (2048, 64),
    ]
    assert all(r["finished"] == 60 and r["profile"] == "llama2-7b-a100" for r in seq)
    # four running sequences at most make requests wait longer than 64 would
    assert seq[0]["ttft_p99_s"] > seq[1]["ttft_p99_s"]
    paths = write_sweep(seq, tmp_path / "out")
    assert (
        len(pd.read_parquet(paths[1])) == 4
        and list(pd.read_csv(paths[0]).label)[0] == "vllm-default max_num_batched_tokens=512 max_num_seqs=4"
    )
    assert paths[2] == tmp_path / "out" / "tradeoff.png" and paths[2].stat().st_size > 10_000


def test_invalid_configuration_fails_before_running(tiny_trace):
    spec = SweepSpec({"trace": tiny_trace})
    with pytest.raises(ValueError, match="max_num_seqs"):
        run_sweep(
            spec, grid_points(["vllm-default"], parse_grid(["max_num_batched_tokens=16", "max_num_seqs=64"])), workers=2
        )


WORKER_POLICIES = Path(__file__).with_name("worker_policies.py")
ENGINE = str(Path(sys.executable).with_name("engine"))


def _error_line(*args) -> tuple[int, str]:
    done = subprocess.run([ENGINE, *map(str, args)], capture_output=True, text=True, timeout=300)
    lines = done.stderr.strip().splitlines()
    assert len(lines) <= 1, done.stderr
    return done.returncode, re.sub(r" at 0x[0-9a-f]+", "", lines[0] if lines else "")


@pytest.mark.parametrize("name", FAILING)
def test_a_policy_failing_in_a_worker_fails_the_sweep_with_the_line_a_single_run_gives(name, tiny_trace, tmp_path):
    """Exceptions a worker cannot send back as they are (a PolicyError, an unpicklable or unprintable value, a
    SystemExit) once broke the pool ("unexpected BrokenProcessPool", exit 1) or ended the sweep with exit 0; a hook's
    SystemExit(0) also ended a single run with exit 0 and no results."""
    policy = f"{WORKER_POLICIES}:{name}"
    code, line = _error_line(
        "sweep", "-p", policy, "-p", "fcfs", "-j", "2", "--trace", tiny_trace, "-q", "-o", tmp_path / "out"
    )
    single_code, single = _error_line("run", "-p", policy, "--trace", tiny_trace, "-q")
    assert code == single_code == 2 and line.startswith(single) and "policy 'worker-" in line, (line, single)
    assert not (tmp_path / "out").exists()


def test_a_worker_that_ends_its_process_names_the_points_it_may_have_run(tiny_trace, tmp_path):
    code, line = _error_line(
        "sweep",
        "-p",
        f"{WORKER_POLICIES}:EndsItsProcess",
        "-j",
        "2",
        "--set",
        "max_num_seqs=4,8",
        "--trace",
        tiny_trace,
        "-q",
        "-o",
        tmp_path / "out",
    )
    assert code == 2 and "a worker ended without finishing its point" in line, line
    assert "EndsItsProcess max_num_seqs=" in line


def test_a_policy_exiting_zero_fails_the_leaderboard_and_writes_no_board(tmp_path):
    code, line = _error_line(
        "leaderboard",
        "-p",
        f"{WORKER_POLICIES}:ExitsZero",
        "-p",
        "fcfs",
        "-w",
        "sharegpt@6",
        "-n",
        "20",
        "--seeds",
        "1",
        "-j",
        "2",
        "-q",
        "-o",
        tmp_path / "board",
    )
    assert code == 2 and "policy 'worker-exits-zero' in select_batch: raised SystemExit: 0 (at " in line, line
    assert not (tmp_path / "board").exists()
