"""End to end through the installed console script: run with outputs and plots, sweep, calibrate."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

ENGINE = str(Path(sys.executable).parent / "engine")


def engine(*args, cwd=None):
    return subprocess.run([ENGINE, *map(str, args)], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_run_builtin_azure_writes_every_output(tmp_path):
    out = tmp_path / "out"
    proc = engine(
        "run",
        "--policy",
        "vllm-default",
        "--workload",
        "azure-conv",
        "-n",
        "400",
        "--output",
        out,
        "--plot",
        "--slo-ttft",
        "2",
        "--slo-tpot",
        "0.05",
        "-q",
    )
    assert proc.returncode == 0, proc.stderr
    assert "SLO goodput" in proc.stdout
    for name in (
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
    ):
        assert (out / name).stat().st_size > 0, name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["profile"] == "llama2-7b-a100" and summary["workload"]["name"] == "azure-conv"
    assert summary["num_requests"] == 400 and summary["finished"] + summary["ignored"] == 400
    assert {"slo", "fairness", "kv_usage"} <= set(summary)
    assert len(pd.read_parquet(out / "requests.parquet")) == 400
    assert (out / "report.html").read_text().startswith("<!doctype html>")


def test_trace_rate_scale_and_sweep(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        + "".join(f"2024-01-01 00:00:{i // 2:02d}.{5 * (i % 2)}000000,{100 + 13 * i},{10 + i}\n" for i in range(40))
    )
    proc = engine("run", "--trace", trace, "--rate-scale", "2", "--output", tmp_path / "r", "-q")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["workload"]["rate_scale"] == 2.0
    proc = engine(
        "sweep",
        "--policy",
        "vllm-default",
        "--set",
        "delay_factor=0,1",
        "--set",
        "max_num_batched_tokens=512,2048",
        "--trace",
        trace,
        "-o",
        tmp_path / "sw",
        "-j",
        "2",
        "-q",
    )
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(tmp_path / "sw" / "sweep.csv")
    assert len(table) == 4 and set(table.delay_factor) == {0.0, 1.0}
    assert (tmp_path / "sw" / "tradeoff.png").exists() and (tmp_path / "sw" / "sweep.parquet").exists()


def test_calibrate_then_run_with_the_fitted_profile(tmp_path):
    from kvsched.executors.calibration import StepRecorder
    from kvsched.experiments.simulation import run_simulation
    from kvsched.workloads.embedded import SyntheticWorkload

    rec = StepRecorder()
    run_simulation(SyntheticWorkload(num_requests=40).requests(), on_step=rec)
    rec.save(tmp_path / "steps.csv")
    proc = engine("calibrate", tmp_path / "steps.csv", "--name", "mine", "-o", tmp_path / "mine.json")
    assert proc.returncode == 0, proc.stderr
    assert "relative error: mean 0.00%" in proc.stdout
    fitted = json.loads((tmp_path / "mine.json").read_text())
    from kvsched.executors.cost_model import LLAMA2_7B_A100

    for term in ("base_ms", "prefill_token_ms", "attention_pair_ms"):  # the run's prompts give the pairs
        assert fitted[term] == __import__("pytest").approx(getattr(LLAMA2_7B_A100, term)), term
    proc = engine("run", "-n", "20", "--profile", tmp_path / "mine.json", "--output", tmp_path / "o", "-q")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["profile"] == "mine"


def test_bad_inputs_are_one_line_exit_2(tmp_path):
    bad = tmp_path / "steps.csv"
    bad.write_text("prefill_tokens,decode_seqs\n1,2\n")
    for args, text in (
        (("calibrate", bad), "missing column(s) kv_tokens_read"),
        (("run", "--profile", "nope"), "unknown cost profile 'nope'"),
        (("run", "--workload", "nope"), "unknown workload 'nope'"),
        (("sweep", "--set", "nope=1", "-q"), "unknown engine setting 'nope'"),
    ):
        proc = engine(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and text in lines[0], (args, proc.stderr)
