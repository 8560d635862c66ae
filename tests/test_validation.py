"""``engine validate`` and ``engine calibrate --from`` on the shipped H100 runs, the inference-perf report
schema, and the fit's re-timing (a tape re-timed with the efficiencies it ran with is the simulation)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvsched.executors.hardware import load_hardware
from kvsched.experiments.gpu_fit import PRIORS, fit, in_overload, record
from kvsched.experiments.validation import (
    counted_outputs,
    experiment_profile,
    inverse_count_mean,
    mean_errors,
    mean_inverse,
    quantile_values,
    read_experiment,
    stretch_tail,
    validate,
)
from kvsched.metrics.lifecycle import read_lifecycle

ENGINE = str(Path(sys.executable).with_name("engine"))
DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "blis-h100"
CODELLAMA = DATA / "20260218-150956-codellama-34b-tp2-codegen"
REASONING = DATA / "20260217-170634-llama-2-7b-tp1-reasoning"


def keys(tree, prefix=""):
    """Every key path of a JSON tree."""
    if not isinstance(tree, dict):
        return set()
    out = set()
    for k, v in tree.items():
        out.add(prefix + k)
        out |= keys(v, prefix + k + ".")
    return out


def test_the_shipped_runs_read_and_the_overloaded_ones_are_known():
    runs = [read_experiment(d) for d in sorted(DATA.iterdir()) if d.is_dir()]
    assert len(runs) == 16
    assert {x.tp for x in runs} == {1, 2, 4} and len({x.model for x in runs}) == 4
    assert sorted(x.name.split("-")[-1] for x in runs if in_overload(x)) == ["reasoning"] * 4
    codegen = read_experiment(CODELLAMA)
    assert codegen.client.name == "config.yaml" and codegen.stages == [
        "stage_0_lifecycle_metrics.json",
        "stage_1_lifecycle_metrics.json",
    ]


def test_a_quick_validation_is_close_and_its_files_have_inference_perfs_schema(tmp_path):
    result = subprocess.run(
        [
            ENGINE,
            "validate",
            str(CODELLAMA),
            "--hardware",
            "h100-sxm",
            "--scale",
            "0.05",
            "-q",
            "--output",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "e2e" in result.stdout and "time per experiment" in result.stdout
    rows = json.loads((tmp_path / "validation.json").read_text())["rows"]
    assert len(rows) == 2 * 3  # two stages, three metrics
    assert all(abs(r["err_mean"]) < 0.15 for r in rows if r["metric"] == "e2e")
    ours = read_lifecycle(tmp_path / CODELLAMA.name / "stage_1_lifecycle_metrics.json")
    theirs = json.loads((CODELLAMA / "results" / "stage_1_lifecycle_metrics.json").read_text())
    assert keys(ours) == keys(theirs)  # the published schema, key for key
    summary = read_lifecycle(tmp_path / CODELLAMA.name / "summary_lifecycle_metrics.json")
    assert keys(summary) == keys(json.loads((CODELLAMA / "results" / "summary_lifecycle_metrics.json").read_text()))


def test_an_overloaded_run_times_out_most_of_its_requests_as_the_real_one_did():
    v = validate(read_experiment(REASONING), "h100-sxm", scale=0.25)
    report = v.simulated["stage_0_lifecycle_metrics.json"]
    real = read_experiment(REASONING).recorded["stage_0_lifecycle_metrics.json"]
    assert report["failures"]["count"] > 0.3 * report["load_summary"]["count"]  # the client's 300 s timeout
    assert real["failures"]["count"] > 0.5 * real["load_summary"]["count"]
    assert report["failures"]["request_latency"]["min"] == pytest.approx(300.0)


def test_retiming_a_tape_with_its_own_efficiencies_is_the_simulation():
    x = read_experiment(CODELLAMA)
    profile = experiment_profile(x, load_hardware("h100-sxm").model_copy(update={"efficiency": PRIORS}))
    tape = record(x, profile, scale=0.05)
    v = validate(x, None, profile=profile, scale=0.05)
    retimed = tape.retime(PRIORS)
    for row in v.rows():
        if row["metric"] == "itl":
            continue
        values = retimed[row["stage"]][row["metric"]]
        assert float(np.mean(values)) == pytest.approx(row["sim_mean"], rel=1e-9)
    fitted = fit([tape], PRIORS, iterations=150)
    assert tape.loss(fitted) < tape.loss(PRIORS)


def test_calibrate_from_writes_a_gpu_the_validator_takes(tmp_path):
    out = tmp_path / "my-h100.json"
    result = subprocess.run(
        [
            ENGINE,
            "calibrate",
            "--from",
            str(CODELLAMA),
            "--from",
            str(REASONING),
            "--hardware",
            "h100-sxm",
            "--rounds",
            "1",
            "--scale",
            "0.02",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert "left out (in overload" in result.stdout and REASONING.name in result.stdout
    gpu = load_hardware(out)
    assert CODELLAMA.name in gpu.efficiency.fitted_on and gpu.bf16_tflops == 989.4


@pytest.mark.parametrize(
    "args, message",
    [
        (("validate", "nowhere", "--hardware", "h100-sxm"), "nowhere/exp-config.yaml: cannot read"),
        (("validate", str(CODELLAMA), "--hardware", "tpu-v9"), "unknown hardware 'tpu-v9'"),
        (("validate", str(CODELLAMA)), "Missing option '--hardware'"),
        (("run", "--hardware", "h100-sxm", "-q"), "--hardware and --model-config go together"),
        (("run", "--hardware", "h100-sxm", "--model-config", "llama-3.1-8b", "--tp", "3", "-q"), "--tp 3"),
        (
            ("run", "--hardware", "h100-sxm", "--model-config", "nothing.json", "-q"),
            "nothing.json: no such model config",
        ),
    ],
)
def test_bad_gpu_options_are_one_line_and_exit_2(args, message):
    result = subprocess.run([ENGINE, *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_engine_run_on_a_gpu_writes_inference_perfs_files(tmp_path):
    config = CODELLAMA / "results" / "config.yaml"
    result = subprocess.run(
        [
            ENGINE,
            "run",
            "--hardware",
            "h100-sxm",
            "--model-config",
            "codellama-34b",
            "--tp",
            "2",
            "--workload",
            str(config),
            "-p",
            "vllm-v1",
            "--set",
            "max_num_seqs=128",
            "--set",
            "max_num_batched_tokens=2048",
            "--set",
            "num_gpu_blocks=20000",
            "--set",
            "enable_prefix_caching=true",
            "-n",
            "300",
            "-q",
            "--output",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    stage = read_lifecycle(tmp_path / "out" / "stage_0_lifecycle_metrics.json")
    assert stage["successes"]["count"] == 300 and stage["load_summary"]["requested_rate"] == 5.0
    assert not (tmp_path / "out" / "stage_1_lifecycle_metrics.json").exists()  # cut short by -n: never reached
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["profile"] == "codellama-34b-h100-sxm-tp2-bf16" and summary["finished"] == 300
    assert 3.0 < stage["successes"]["latency"]["request_latency"]["mean"] < 4.5  # the real run: 3.61 s


def test_the_drawn_counts_give_each_stage_its_recorded_time_per_token():
    """Every request of these runs generates its full length (``ignore_eos``), so its latency is independent of
    the client's count, and a stage's mean time per token is its mean latency times the mean inverse count. The
    draw must give that mean: interpolating the report's quantiles alone missed it by up to 30 %."""
    for run in sorted(d for d in DATA.iterdir() if d.is_dir()):
        x = read_experiment(run)
        for name in x.stages:
            successes = x.recorded[name]["successes"]
            stage = int(name.split("_")[1])
            log = [SimpleNamespace(outcome="ok", stage=stage, request_id=f"r{i}") for i in range(successes["count"])]
            counts = list(counted_outputs(x, log).values())
            assert all(type(n) is int and n >= 0 for n in counts)
            assert mean_inverse(counts) == pytest.approx(inverse_count_mean(successes), rel=0.03), (run.name, name)
            assert np.mean(counts) == pytest.approx(successes["output_len"]["mean"], rel=0.04), (run.name, name)


def test_where_the_server_stopped_at_eos_the_counts_are_the_quantile_draw_alone():
    """With EOS honoured a count and its latency go together, so the report's mean time per token says nothing
    about the counts: the stretch must be off, leaving the plain draw (which the ignore_eos draw is not)."""
    run = next(d for d in sorted(DATA.iterdir()) if d.is_dir() and "llama-2-7b-tp1-codegen" in d.name)
    x = read_experiment(run)
    successes = x.recorded["stage_0_lifecycle_metrics.json"]["successes"]
    log = [SimpleNamespace(outcome="ok", stage=0, request_id=f"r{i}") for i in range(successes["count"])]
    plain = counted_outputs(x, log, ignore_eos=False)
    u = (np.random.default_rng(0).permutation(len(log)) + 0.5) / len(log)
    assert list(plain.values()) == [int(n) for n in np.rint(quantile_values(successes["output_len"], u))]
    assert plain != counted_outputs(x, log)


@given(st.lists(st.tuples(st.integers(0, 400), st.booleans()), min_size=1, max_size=60), st.floats(1e-3, 1.5))
def test_stretching_the_tail_only_moves_its_non_zero_counts_and_only_towards_the_target(draws, target):
    counts = np.array([n for n, _ in draws], dtype=float)
    tail = np.array([t for _, t in draws])
    out = stretch_tail(counts, tail, target)
    moved = tail & (counts > 0)
    assert np.array_equal(out[~moved], counts[~moved])  # outside the tail, and the recorded zeros, kept
    assert np.all(out[moved] >= 1) and np.array_equal(out, np.rint(out))
    assert abs(mean_inverse(out) - target) <= abs(mean_inverse(counts) - target) + 1e-12
    assert np.array_equal(stretch_tail(counts, tail, None), counts)


def test_mean_errors_average_absolute_errors():
    rows = [
        {"metric": "e2e", "err_mean": 0.1, "err_p90": -0.2, "err_p99": 0.0},
        {"metric": "e2e", "err_mean": -0.3, "err_p90": 0.2, "err_p99": float("nan")},
    ]
    errors = mean_errors(rows)
    assert errors["e2e_mean"] == pytest.approx(0.2) and errors["e2e_p90"] == pytest.approx(0.2)
    assert errors["e2e_p99"] == 0.0


@pytest.mark.slow  # one run at full length: about 15 s idle, a minute on a loaded 2-core machine
def test_engine_validate_prints_the_documented_numbers(tmp_path):
    """docs/fidelity.md's in-sample rows come from benchmarks/calibrate_gpu.py; the shipped efficiencies and
    ``engine validate`` give them again, to the last digit (a simulation is deterministic)."""
    figures = Path(__file__).resolve().parents[1] / "docs" / "figures" / "gpu-fidelity"
    documented = json.loads((figures / "rows.json").read_text())
    run = DATA / "20260218-084319-llama-2-70b-tp4-roleplay"
    expected = [r for r in documented if r["fold"] == "in sample" and r["experiment"] == run.name]
    result = subprocess.run(
        [ENGINE, "validate", str(run), "--hardware", "h100-sxm", "-q", "--output", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    rows = json.loads((tmp_path / "validation.json").read_text())["rows"]
    assert len(rows) == len(expected) == 3
    for got, want in zip(rows, expected):
        for key in ("sim_mean", "sim_p90", "sim_p99", "real_mean", "err_mean"):
            assert got[key] == pytest.approx(want[key], rel=1e-9), (got["metric"], key)
