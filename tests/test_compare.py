"""``engine compare`` over several seeds: Student-t intervals, and a seed-independent workload run once."""

import subprocess
import sys
from pathlib import Path

import pytest

from kvsched.experiments.compare import PolicyRun, distinct_workloads, table_rows
from kvsched.metrics.confidence import mean_interval, t_critical
from kvsched.workloads import build_workload

ENGINE = str(Path(sys.executable).parent / "engine")


@pytest.mark.parametrize("df, value", [(1, 12.706), (2, 4.303), (4, 2.776), (9, 2.262), (30, 2.042), (1000, 1.962)])
def test_t_critical_values_match_the_table(df, value):
    assert t_critical(df) == pytest.approx(value, abs=5e-4)


def test_mean_interval():
    assert mean_interval([2.0]) == (2.0, 0.0)
    mean, half = mean_interval([1.0, 2.0, 3.0])  # sd 1, n 3: 4.303 / sqrt(3)
    assert mean == 2.0 and half == pytest.approx(4.3027 / 3 ** 0.5, rel=1e-4)


def _summary(rate: float) -> dict:
    latency = {"mean": 0.5, "p50": 0.4, "p90": 0.8, "p99": 0.9}
    return {"finished": 10, "requests_per_s": rate, "throughput_tokens_per_s": 100.0, "ttft_s": latency, "tpot_s": latency,
            "e2e_s": latency, "preemptions": {"recompute": 1, "swap": 2}}


def test_table_cells_carry_the_interval_over_seeds():
    rows = {r[0]: r[1:] for r in table_rows([PolicyRun("p", [_summary(v) for v in (1.0, 2.0, 3.0)])])}
    assert rows["finished"] == ["10 ± 0"] and rows["preemptions"] == ["3 ± 0"]
    assert rows["throughput (req/s)"] == ["2.000 ± 2.484"]  # sd 1 over 3 seeds: 4.303 / sqrt(3)
    assert {r[0]: r[1:] for r in table_rows([PolicyRun("p", [_summary(2.0)])])}["throughput (req/s)"] == ["2.000"]


def test_a_trace_replay_does_not_depend_on_the_seed():
    assert len(distinct_workloads([build_workload("azure-conv", num_requests=50, seed=s) for s in range(3)])) == 1
    assert len(distinct_workloads([build_workload(None, num_requests=50, seed=s) for s in range(3)])) == 3


def test_engine_compare_over_seeds(tmp_path):
    proc = subprocess.run([ENGINE, "compare", "--policy", "fcfs", "--policy", "sjf", "-n", "40", "--seeds", "2"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "seeds 0–1, mean ± 95% CI" in proc.stdout and " ± " in proc.stdout.split("TTFT p99 (s)")[1].splitlines()[0]


def test_compare_puts_result_folders_side_by_side(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    engine = Path(sys.executable).with_name("engine")
    for policy in ("fcfs", "sjf"):
        subprocess.run([engine, "run", "--policy", policy, "-n", "30", "-o", tmp_path / policy, "-q"], check=True, capture_output=True)
    done = subprocess.run([engine, "compare", tmp_path / "fcfs", tmp_path / "sjf", "-o", tmp_path / "cmp", "--plot"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "fcfs (fcfs)" in done.stdout and "sjf (sjf)" in done.stdout
    assert (tmp_path / "cmp" / "comparison_cdf.png").stat().st_size > 10_000
    missing = subprocess.run([engine, "compare", tmp_path / "fcfs", tmp_path / "nowhere"], capture_output=True, text=True)
    assert missing.returncode == 2 and "has no summary.json" in missing.stderr and "Traceback" not in missing.stderr
