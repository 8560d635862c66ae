"""Sweeps: grid parsing, parallel = sequential results, the table and the trade-off plot."""

import pandas as pd
import pytest

from kvsched.experiments.sweep import Point, SweepSpec, grid_points, parse_grid, run_sweep
from kvsched.reporting.files import write_sweep


@pytest.fixture
def tiny_trace(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("arrival_time_s,prompt_tokens,output_tokens\n" + "".join(f"{i * 0.05:.2f},{200 + 37 * i % 300},{20 + 7 * i % 40}\n" for i in range(60)))
    return p


def test_grid_parsing_and_points():
    grid = parse_grid(["delay_factor=0,0.5,1,2", "max_num_batched_tokens=512, 2048"])
    assert grid == {"delay_factor": ["0", "0.5", "1", "2"], "max_num_batched_tokens": ["512", "2048"]}
    points = grid_points(["vllm-default", "other"], grid)
    assert len(points) == 16 and points[0] == Point("vllm-default", {"delay_factor": "0", "max_num_batched_tokens": "512"})
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
    assert [(r["max_num_batched_tokens"], r["max_num_seqs"]) for r in seq] == [(512, 4), (512, 64), (2048, 4), (2048, 64)]
    assert all(r["finished"] == 60 and r["profile"] == "llama2-7b-a100" for r in seq)
    # four running sequences at most make requests wait longer than 64 would
    assert seq[0]["ttft_p99_s"] > seq[1]["ttft_p99_s"]
    paths = write_sweep(seq, tmp_path / "out")
    assert len(pd.read_parquet(paths[1])) == 4 and list(pd.read_csv(paths[0]).label)[0] == "vllm-default max_num_batched_tokens=512 max_num_seqs=4"
    assert paths[2] == tmp_path / "out" / "tradeoff.png" and paths[2].stat().st_size > 10_000


def test_invalid_configuration_fails_before_running(tiny_trace):
    spec = SweepSpec({"trace": tiny_trace})
    with pytest.raises(ValueError, match="max_num_seqs"):
        run_sweep(spec, grid_points(["vllm-default"], parse_grid(["max_num_batched_tokens=16", "max_num_seqs=64"])), workers=2)
