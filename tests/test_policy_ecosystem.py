"""The whole path a policy author sees: installed distribution → engine policies → engine --policy → check/compare →
pytest."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import distribution
from pathlib import Path

import pytest

ENGINE = str(Path(sys.executable).parent / "engine")
ROOT = Path(__file__).resolve().parents[1]


def engine(*args, timeout=300):
    return subprocess.run([ENGINE, *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_priority_vip_is_an_installed_distribution_with_the_entry_point():
    dist = distribution("kvsched-priority-vip")
    names = {ep.name: ep.value for ep in dist.entry_points if ep.group == "kvsched.policies"}
    assert names == {"priority-vip": "kvsched_priority_vip:PriorityVip"}


def test_engine_policies_lists_every_policy_with_its_distribution():
    proc = engine("policies")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for name in ("vllm-default", "fcfs", "sarathi", "sjf", "vtc", "lpm"):
        assert any(f"│ {name} " in line and "│ kvsched " in line for line in lines), name
    assert any("│ priority-vip " in line and "kvsched-priority-vip" in line for line in lines)


def test_engine_runs_priority_vip():
    proc = engine("--policy", "priority-vip", "-n", "60", "-q")
    assert proc.returncode == 0, proc.stderr
    assert "policy priority-vip" in proc.stdout and "60 / 0 / 0" in proc.stdout


DRAFT = """
from kvsched import Outcome, hookimpl


class NewestFirst:
    \"\"\"A draft not yet packaged: admit the newest waiting request first.\"\"\"

    def __init__(self, max_admit: int = 4) -> None:
        self.max_admit = int(max_admit)

    @hookimpl
    def select_batch(self, step):
        for group in list(reversed(step.waiting))[: self.max_admit]:
            if step.admit(group) is not Outcome.SCHEDULED:
                break
        if not step.admitted:
            step.advance_running()
"""


def test_a_policy_file_runs_in_run_compare_and_sweep_before_it_is_packaged(tmp_path):
    draft = tmp_path / "draft.py"
    draft.write_text(DRAFT)
    spec = f"{draft}:NewestFirst"
    proc = engine("run", "--policy", spec, "--policy-opt", "max_admit=2", "-n", "30", "-q")
    assert proc.returncode == 0, proc.stderr
    assert "policy NewestFirst" in proc.stdout and "30 / 0 / 0" in proc.stdout
    proc = engine("compare", "-p", "fcfs", "-p", spec, "-n", "30", "--seeds", "1", "-q")
    assert proc.returncode == 0, proc.stderr
    assert "NewestFirst" in next(line for line in proc.stdout.splitlines() if "metric" in line)
    proc = engine(
        "sweep", "-p", spec, "--set", "max_num_seqs=4,16", "-n", "30", "-j", "2", "-q", "-o", tmp_path / "sweep"
    )
    assert proc.returncode == 0, proc.stderr
    rows = (tmp_path / "sweep" / "sweep.csv").read_text().splitlines()[1:]
    assert len(rows) == 2 and all(f",{spec}," in row for row in rows)  # the policy column reruns the draft


def test_engine_check_passes_priority_vip():
    proc = engine(
        "check", "--policy", "priority-vip", "--examples", "15", "--steps", "20", "--starvation-examples", "1"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for row in ("valid-decisions", "no-leaked-blocks", "starvation-free", "priority-preemption"):
        assert row in proc.stdout
    assert "FAIL" not in proc.stdout


def test_engine_check_fails_a_broken_policy_with_the_shrunk_counterexample():
    proc = engine(
        "check",
        "--policy",
        "tests/broken_policies.py:AdmitsRunning",
        "--examples",
        "15",
        "--steps",
        "8",
        "--starvation-examples",
        "1",
        "--shrink-seconds",
        "4",
    )
    assert proc.returncode == 1
    assert "FAIL" in proc.stdout and "is RUNNING, not WAITING" in proc.stdout
    assert "state.start(" in proc.stdout and "1 failed: valid-decisions" in proc.stdout


def test_engine_check_unknown_policy_is_one_line():
    proc = engine("check", "--policy", "no-such-policy")
    assert proc.returncode == 2 and "unknown policy 'no-such-policy'" in proc.stderr and "Traceback" not in proc.stderr


def test_engine_compare_prints_side_by_side_and_plots(tmp_path):
    png = tmp_path / "comparison_cdf.png"
    proc = engine(
        "compare",
        "--policy",
        "fcfs",
        "--policy",
        "sjf",
        "--policy",
        "priority-vip",
        "-n",
        "80",
        "--policy-opt",
        "sjf.predictor=bucketed",
        "--output",
        tmp_path,
        "--plot",
    )
    assert proc.returncode == 0, proc.stderr
    header = next(line for line in proc.stdout.splitlines() if "metric" in line)
    assert "fcfs" in header and "sjf" in header and "priority-vip" in header
    assert "TTFT p99 (s)" in proc.stdout and png.stat().st_size > 10_000


def test_engine_compare_needs_two_policies():
    proc = engine("compare", "--policy", "fcfs")
    assert proc.returncode == 2 and "at least two" in proc.stderr


@pytest.mark.parametrize("policy", ["fcfs"])
def test_pytest_pyargs_runs_the_suite_on_an_installed_policy(policy, tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--pyargs",
            "kvsched.testing",
            "--policy",
            policy,
            "-q",
            "-p",
            "no:cacheprovider",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "3 passed" in proc.stdout


def test_pytest_plugin_module_is_import_light():
    """pytest loads it in every run of this environment: it must not pull in the engine or Hypothesis."""
    code = (
        "import sys, kvsched.testing.pytest_plugin; print(sorted(m for m in ('hypothesis', 'kvsched.core.engine', "
        "'kvsched.testing.machine', 'pydantic') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
