"""``engine sweep --ray``: the grid's points as Ray tasks give the process pool's rows exactly.

Real Ray throughout (the ``ray`` extra; the module is skipped, saying so, only where it cannot be
imported): the CLI's own local Ray, started and stopped by the command, then one Ray of two CPUs
that the API tests share and shut down. Rows are compared whole except ``wall_s``, each point's
own wall time, which differs between any two runs.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from worker_policies import FAILING

from kvsched.errors import KvschedError
from kvsched.experiments.sweep import SweepSpec, grid_points, parse_grid, run_sweep

ENGINE = str(Path(sys.executable).with_name("engine"))


def _strip(rows):
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]


@pytest.fixture(scope="module")
def tiny_trace(tmp_path_factory):
    p = tmp_path_factory.mktemp("trace") / "t.csv"
    p.write_text(
        "arrival_time_s,prompt_tokens,output_tokens\n"
        + "".join(f"{i * 0.05:.2f},{200 + 37 * i % 300},{20 + 7 * i % 40}\n" for i in range(60))
    )
    return p


def test_without_ray_installed_the_sweep_says_how_to_get_it(tiny_trace, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails as it does where the extra is missing
    points = grid_points(["vllm-default"], parse_grid(["max_num_seqs=4,64"]))
    with pytest.raises(ValueError, match=r"--ray needs the ray package: pip install 'kvsched\[ray\]'"):
        run_sweep(SweepSpec({"trace": tiny_trace}), points, ray_address="local")


try:
    import ray
except ImportError:
    ray = None
pytestmark_ray = pytest.mark.skipif(ray is None, reason="the ray extra is not installed (pip install 'kvsched[ray]')")


def _ray_processes(driver_pid: int) -> set[str]:
    """The GCS and raylet of the Ray a driver started: Ray names its session after the driver's pid
    (session_<date>_<pid>), so another run's Ray on the same machine is not counted."""
    out = subprocess.run(
        ["pgrep", "-f", f"(gcs_server|raylet).*session_[0-9_-]+_{driver_pid}( |/|$)"], capture_output=True, text=True
    ).stdout
    return set(out.split())


@pytest.mark.slow  # two sweeps and a Ray's start: about 2 minutes on a loaded 2-core machine
@pytestmark_ray
def test_cli_sweep_on_its_own_local_ray_writes_the_process_pools_table(tiny_trace, tmp_path):
    """``engine sweep --ray`` starts a Ray, runs the grid, stops it: its sweep.csv is ``-j 2``'s."""
    engine = [
        ENGINE,
        "sweep",
        "--trace",
        str(tiny_trace),
        "--fix",
        "num_gpu_blocks=256",
        "--set",
        "max_num_batched_tokens=512,2048",
        "--set",
        "max_num_seqs=4,64",
        "-p",
        "vllm-default",
        "-p",
        "fcfs",
        "-j",
        "2",
        "-q",
    ]
    pool = subprocess.run(engine + ["-o", str(tmp_path / "pool")], capture_output=True, text=True, timeout=300)
    assert pool.returncode == 0, pool.stderr
    sweep = subprocess.Popen(
        engine + ["--ray", "-o", str(tmp_path / "ray")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    stdout, stderr = sweep.communicate(timeout=300)
    on_ray = subprocess.CompletedProcess(sweep.args, sweep.returncode, stdout, stderr)
    assert on_ray.returncode == 0, on_ray.stderr
    a, b = (pd.read_csv(tmp_path / name / "sweep.csv").drop(columns="wall_s") for name in ("pool", "ray"))
    assert len(a) == 8 and a.finished.eq(60).all()
    pd.testing.assert_frame_equal(a, b)
    assert (tmp_path / "pool" / "sweep.csv").read_text().splitlines()[0] == (
        tmp_path / "ray" / "sweep.csv"
    ).read_text().splitlines()[0]
    assert not _ray_processes(sweep.pid), "the command left its Ray's GCS or raylet running"


@pytestmark_ray
def test_cli_bad_ray_address_is_one_line(tiny_trace, tmp_path):
    out = subprocess.run(
        [
            ENGINE,
            "sweep",
            "--trace",
            str(tiny_trace),
            "--set",
            "max_num_seqs=4,64",
            "--ray-address",
            "127.0.0.1",
            "-q",
            "-o",
            str(tmp_path / "x"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert "Ray could not start or connect" in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


@pytest.fixture(scope="module")
def ray_session():
    from kvsched.experiments.ray_backend import start_ray

    start_ray(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytestmark_ray
def test_rows_on_ray_equal_process_pool_and_serial(ray_session, tiny_trace):
    spec = SweepSpec({"trace": tiny_trace}, {"num_gpu_blocks": "256"}, slo_ttft=0.5)
    points = grid_points(["vllm-default", "sjf"], parse_grid(["max_num_seqs=4,64"]))
    seen = []
    on_ray = run_sweep(
        spec, points, workers=2, on_done=seen.append, ray_address="auto"
    )  # the Ray already initialized is used
    assert ray_session.is_initialized(), "a Ray the sweep did not start is left running"
    assert _strip(on_ray) == _strip(run_sweep(spec, points, workers=2)) == _strip(run_sweep(spec, points, workers=1))
    assert [r["label"] for r in on_ray] == [p.label for p in points] and sorted(r["label"] for r in seen) == sorted(
        p.label for p in points
    )


@pytestmark_ray
def test_a_points_error_comes_back_as_the_pools_does(ray_session, tiny_trace):
    """A point that fails in its worker raises the same exception on Ray as in the process pool."""
    spec = SweepSpec({"trace": tiny_trace}, profile="no-such-profile")
    points = grid_points(["vllm-default"], parse_grid(["max_num_seqs=4,64"]))
    with pytest.raises(Exception) as in_pool:
        run_sweep(spec, points, workers=2)
    with pytest.raises(type(in_pool.value), match="no-such-profile"):
        run_sweep(spec, points, workers=2, ray_address="auto")


@pytestmark_ray
@pytest.mark.parametrize("name", FAILING)
def test_a_policy_failing_in_a_ray_task_fails_as_in_one_process(ray_session, tiny_trace, name):
    """Ray once answered these with "unexpected UnserializableException" (or the policy's exit status)."""
    spec = SweepSpec({"trace": tiny_trace})
    points = grid_points([f"{Path(__file__).with_name('worker_policies.py')}:{name}"], {})
    with pytest.raises(KvschedError) as here:
        run_sweep(spec, points, workers=1)
    with pytest.raises(KvschedError) as on_ray:
        run_sweep(spec, points, workers=2, ray_address="auto")
    strip = lambda exc: re.sub(r" at 0x[0-9a-f]+", "", str(exc.value))  # noqa: E731 (a lambda's address differs)
    assert strip(on_ray) == strip(here) and strip(here).startswith("policy 'worker-"), (
        str(on_ray.value),
        str(here.value),
    )


def _sweep(tmp_path, *args, env=None):
    return subprocess.run(
        [ENGINE, "sweep", "-n", "5", "-q", "-o", str(tmp_path / "out"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


@pytestmark_ray
def test_an_address_where_nothing_listens_fails_at_once(tmp_path):
    """Ray retried such an address for minutes (still at it after 180 s)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    start = time.monotonic()
    out = _sweep(tmp_path, "--ray-address", f"127.0.0.1:{port}")
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert f"nothing answers at 127.0.0.1:{port}" in out.stderr and time.monotonic() - start < 60


@pytestmark_ray
def test_an_address_that_answers_but_is_no_ray_fails_after_the_ray_timeout(tmp_path):
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        start = time.monotonic()
        out = _sweep(tmp_path, "--ray-address", f"127.0.0.1:{listening.getsockname()[1]}", "--ray-timeout", "3")
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "no Ray cluster answered within 3 s (--ray-timeout)" in out.stderr and time.monotonic() - start < 60


def test_a_ray_whose_import_exits_zero_fails_the_sweep(tmp_path):
    """A broken Ray install that exits 0 as it is imported once ended the sweep with exit 0 and no results."""
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "__init__.py").write_text("raise SystemExit(0)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    out = _sweep(tmp_path, "--ray", env=env)
    assert out.returncode == 2, out.stderr
    assert out.stderr == "error: --ray: the ray package fails to import: SystemExit: 0\n"
    assert not (tmp_path / "out").exists()
