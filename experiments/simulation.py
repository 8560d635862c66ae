"""One simulation: build the engine, feed the workload, collect metrics and time series.

``run_simulation`` runs the engine and summarizes it; ``SimJob`` adds what a person looks at: the
observers (time series, tenant service, the decision log), the extensions of ``summary.json``
(workload, SLO goodput, fairness, KV usage) and the wall-clock cost of the run. The CLI, sweeps and benchmarks
all go through ``SimJob``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvsched.core.config import EngineConfig
from kvsched.core.engine import Engine
from kvsched.core.report import StepReport
from kvsched.core.request import Request
from kvsched.executors.profiles import resolve_profile
from kvsched.executors.simulated import SimulatedExecutor
from kvsched.metrics.decision_log import DecisionLog
from kvsched.metrics.fairness import TenantService, fairness_summary
from kvsched.metrics.goodput import goodput_summary
from kvsched.metrics.requests import RequestMetrics, summarize
from kvsched.metrics.timeseries import TimeSeriesRecorder


@dataclass
class RunResult:
    engine: Engine
    requests: list[RequestMetrics]
    summary: dict[str, Any]


def run_simulation(
    requests: list[Request],
    policy: str | Any = "vllm-default",
    config: EngineConfig | None = None,
    profile: str = "llama2-7b-a100",
    policy_options: dict[str, Any] | None = None,
    on_step: Callable[[StepReport], None] | None = None,
    **summary_extra: Any,
) -> RunResult:
    """Run ``requests`` through a simulated engine and summarize; deterministic for equal inputs."""
    config = config or EngineConfig()
    executor = SimulatedExecutor(profile)
    engine = Engine(config, policy, executor, policy_options=policy_options)
    engine.run(requests, on_step=on_step)
    metrics = [RequestMetrics.of(g) for g in engine.groups.values()]
    summary = summarize(engine, metrics, profile=executor.profile.name, **summary_extra)
    return RunResult(engine, metrics, summary)


@dataclass
class SimOutcome:
    result: RunResult
    timeseries: TimeSeriesRecorder | None
    wall_s: float
    simulate_s: float  # engine loop only (no workload building)
    num_requests: int
    decision_log: Path | None = None  # decisions.parquet, when the job kept one

    @property
    def summary(self) -> dict[str, Any]:
        return self.result.summary


@dataclass
class SimJob:
    workload: Any  # kvsched.workloads.Workload
    policy: str = "vllm-default"
    config: EngineConfig = field(default_factory=EngineConfig)
    profile: Any = "llama2-7b-a100"
    policy_options: dict[str, Any] | None = None
    slo_ttft: float | None = None
    slo_tpot: float | None = None
    record_timeseries: bool = True
    decision_log: Path | None = None  # write the decision log (Parquet) here as the run goes

    def run(self, on_step: Callable[[StepReport], None] | None = None, on_start: Callable[[int], None] | None = None) -> SimOutcome:
        """Build the requests, tell ``on_start`` how many, simulate, and extend the summary."""
        start = time.perf_counter()
        requests = self.workload.requests()
        if on_start is not None:
            on_start(len(requests))
        observers: list[Callable[[StepReport], None]] = []
        series = TimeSeriesRecorder() if self.record_timeseries else None
        if series is not None:
            observers.append(series)
        service = TenantService(requests)
        if len(service.tenants) > 1:
            observers.append(service)
        log = DecisionLog(self.decision_log) if self.decision_log is not None else None
        if log is not None:
            observers.append(log)
        if on_step is not None:
            observers.append(on_step)
        if len(observers) == 1:
            observe = observers[0]
        elif observers:
            def observe(report: StepReport) -> None:
                for o in observers:
                    o(report)
        else:
            observe = None
        sim_start = time.perf_counter()
        description = self.workload.describe()
        try:
            result = run_simulation(
                requests, self.policy, self.config, resolve_profile(self.profile), self.policy_options, on_step=observe,
                seed=description.get("seed"), workload=description,
            )
        except BaseException:
            if log is not None:
                log.discard()
            raise
        simulate_s = time.perf_counter() - sim_start
        s = result.summary
        s["slo"] = goodput_summary(result.requests, s["duration_s"], self.slo_ttft, self.slo_tpot)
        s["fairness"] = fairness_summary(result.requests, service)
        if series is not None and len(series):
            cols, total = series.columns, self.config.num_gpu_blocks
            s["kv_usage"] = {
                "gpu_blocks_total": total,
                "gpu_blocks_peak": max(cols["gpu_blocks_used"]),
                "gpu_utilization_mean": _time_weighted_mean(cols["gpu_blocks_used"], cols["duration_s"]) / total,
                "cpu_blocks_peak": max(cols["cpu_blocks_used"]),
                "batch_seqs_mean": _time_weighted_mean(cols["batch_seqs"], cols["duration_s"]),
                "waiting_peak": max(cols["num_waiting"]),
            }
        log_path = log.close() if log is not None else None
        return SimOutcome(result, series, time.perf_counter() - start, simulate_s, len(requests), log_path)


def _time_weighted_mean(values: list[float], weights: list[float]) -> float:
    total = sum(weights)
    return sum(v * w for v, w in zip(values, weights)) / total if total > 0 else 0.0
