"""Parameter sweeps: the grid of policies × engine settings, run in parallel processes, one table.

Each grid point is an independent simulation, so points run in a process pool (spawned workers
re-import kvsched; the workload is built once per worker from its picklable description). The
table has one row per configuration: its settings, the headline metrics, the run's warnings
(``metrics/warnings.py``: a point that ignored requests or never drained its queue is not what it
seems) and the wall time.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

from kvsched.core.config import EngineConfig
from kvsched.executors.settings import check_names
from kvsched.experiments.worker_errors import WorkerDied, portable
from kvsched.metrics.warnings import warning_text

METRICS = (
    ("num_requests", ("num_requests",)),
    ("finished", ("finished",)),
    ("ignored", ("ignored",)),
    ("aborted", ("aborted",)),
    ("requests_per_s", ("requests_per_s",)),
    ("output_tokens_per_s", ("throughput_tokens_per_s",)),
    ("ttft_mean_s", ("ttft_s", "mean")),
    ("ttft_p50_s", ("ttft_s", "p50")),
    ("ttft_p99_s", ("ttft_s", "p99")),
    ("tpot_mean_s", ("tpot_s", "mean")),
    ("tpot_p99_s", ("tpot_s", "p99")),
    ("e2e_p50_s", ("e2e_s", "p50")),
    ("e2e_p99_s", ("e2e_s", "p99")),
    ("recompute_tax", ("recompute", "tax")),
    ("preempt_recompute", ("preemptions", "recompute")),
    ("preempt_swap", ("preemptions", "swap")),
    ("goodput_req_per_s", ("slo", "goodput_requests_per_s")),
    ("slo_attainment", ("slo", "slo_attainment")),
    ("jain_index", ("fairness", "jain_index")),
    ("max_service_gap", ("fairness", "max_service_gap")),
    ("duration_s", ("duration_s",)),
    ("length_predictor", ("length_predictor",)),
)


def parse_grid(settings: list[str] | None) -> dict[str, list[str]]:
    """``["delay_factor=0,0.5", "max_num_seqs=64"]`` → ``{"delay_factor": ["0", "0.5"], ...}``."""
    grid: dict[str, list[str]] = {}
    for item in settings or []:
        key, sep, values = item.partition("=")
        key = key.strip()
        if not sep or not key or not values.strip():
            raise ValueError(f"--set expects KEY=V1,V2,..., got {item!r}")
        check_names([key])
        grid[key] = [v.strip() for v in values.split(",") if v.strip()]
    return grid


@dataclass(frozen=True)
class Point:
    policy: str
    settings: dict[str, str]
    options: dict[str, Any] = field(default_factory=dict)  # the policy's constructor options

    @property
    def label(self) -> str:
        name = self.policy + (":" + ",".join(f"{k}={v}" for k, v in self.options.items()) if self.options else "")
        return " ".join([name] + [f"{k}={v}" for k, v in self.settings.items()])


MAX_POINTS = 10_000  # grid points a sweep runs at most (each a simulation): counted before any is made


def grid_points(policies: list[str], grid: dict[str, list[str]]) -> list[Point]:
    keys = list(grid)
    count = len(policies) * math.prod(len(v) for v in grid.values())
    if count > MAX_POINTS:
        raise ValueError(f"the sweep has {count:,} points (policies × values of each --set); at most {MAX_POINTS:,}")
    return [Point(p, dict(zip(keys, combo))) for p in policies for combo in itertools.product(*(grid[k] for k in keys))]


@dataclass
class SweepSpec:
    """Everything a worker needs to run one point (picklable)."""

    workload: dict[str, Any]  # build_workload keyword arguments
    base_settings: dict[str, str] = field(default_factory=dict)
    profile: str = "llama2-7b-a100"
    slo_ttft: float | None = None
    slo_tpot: float | None = None


def run_point(spec: SweepSpec, point: Point) -> dict[str, Any]:
    """One configuration → one table row (settings, metrics, wall time); what it raises is ``portable``:
    the same line in the command's process, whichever worker ran it."""
    try:
        return _row(spec, point)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        error = portable(exc)
        if error is exc:
            raise
        raise error from exc


def _row(spec: SweepSpec, point: Point) -> dict[str, Any]:
    from kvsched.experiments.simulation import SimJob
    from kvsched.workloads import build_workload

    config = EngineConfig.model_validate({**spec.base_settings, **point.settings})
    job = SimJob(
        build_workload(**spec.workload),
        point.policy,
        config,
        spec.profile,
        point.options or None,
        slo_ttft=spec.slo_ttft,
        slo_tpot=spec.slo_tpot,
        record_timeseries=False,
    )
    outcome = job.run()
    row: dict[str, Any] = {"label": point.label, "policy": point.policy}
    row.update({k: config.model_dump()[k] for k in point.settings})
    row.update(summary_metrics(outcome.summary))
    row["warnings"] = "; ".join(map(warning_text, outcome.summary["warnings"]))
    row["profile"] = outcome.summary["profile"]
    row["wall_s"] = outcome.simulate_s
    return row


def summary_metrics(summary: dict[str, Any]) -> dict[str, Any]:
    """The ``METRICS`` of a summary (a run's or a measured one), None where it has no such number."""
    row: dict[str, Any] = {}
    for name, path in METRICS:
        value: Any = summary
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        row[name] = value
    return row


def run_sweep(
    spec: SweepSpec,
    points: list[Point],
    workers: int | None = None,
    on_done: Callable[[dict], None] | None = None,
    ray_address: str | None = None,
    ray_timeout: float | None = None,
) -> list[dict[str, Any]]:
    """Run every point (in parallel when ``workers`` > 1, or as Ray tasks when ``ray_address`` is
    given: ``"local"`` for a Ray started here, else a cluster that must answer within ``ray_timeout``
    seconds); rows come back in grid order."""
    for point in points:  # validate every configuration before spending any time
        EngineConfig.model_validate({**spec.base_settings, **point.settings})
    if ray_address is not None:
        from kvsched.experiments.ray_backend import DEFAULT_CONNECT_TIMEOUT_S, run_points_on_ray

        return run_points_on_ray(
            spec, points, run_point, ray_address, workers, on_done, ray_timeout or DEFAULT_CONNECT_TIMEOUT_S
        )
    workers = max(1, min(workers or os.cpu_count() or 1, len(points)))
    rows: dict[int, dict] = {}
    if workers == 1:
        for i, point in enumerate(points):
            rows[i] = run_point(spec, point)
            if on_done:
                on_done(rows[i])
    else:
        import multiprocessing

        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(run_point, spec, p): i for i, p in enumerate(points)}
            try:
                for fut in as_completed(futures):
                    rows[futures[fut]] = fut.result()
                    if on_done:
                        on_done(rows[futures[fut]])
            except BrokenProcessPool:
                running = [points[i].label for f, i in futures.items() if not f.done() or f.exception() is not None]
                raise WorkerDied(running) from None
    return [rows[i] for i in range(len(points))]
