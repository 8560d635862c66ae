"""One simulation: build the engine, feed the workload, collect metrics and time series.

``run_simulation`` runs the engine and summarizes it; ``SimJob`` adds what a person looks at: the
observers (time series, tenant service, the decision log), the extensions of ``summary.json``
(workload, SLO goodput, fairness, KV usage) and the wall-clock cost of the run, and it fills the engine
settings its config leaves unset from what the profile models (``executors/settings.py``), as a
person running a model on a device would get them. The CLI, sweeps and benchmarks all go through ``SimJob``.

Either keeps every request in memory to the end (the default), or, given a ``stream_to`` folder,
runs in memory bounded by the requests in flight: requests are made as they arrive, the finished
ones are recorded as the loop hands them over, and the per-request records and the time series are written there as
Parquet row groups while the run goes (``requests.parquet``, ``timeseries.parquet``); the summary
is then read from those files, with the same result.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvsched.cluster.fleet_of_one import FleetOfOne
from kvsched.core.config import EngineConfig
from kvsched.core.engine import Engine
from kvsched.core.report import StepReport
from kvsched.core.request import Request
from kvsched.executors.profiles import resolve_profile
from kvsched.executors.settings import filled_settings, fit_to_profile
from kvsched.executors.simulated import SimulatedExecutor
from kvsched.executors.steady_runs import StepRun
from kvsched.metrics.decision_log import DecisionLog
from kvsched.metrics.fairness import TenantService, fairness_summary
from kvsched.metrics.goodput import goodput_summary
from kvsched.metrics.lifecycle import run_reports
from kvsched.metrics.records import RequestLog, RequestTable
from kvsched.metrics.requests import RequestMetrics, summarize
from kvsched.metrics.timeseries import TimeSeriesRecorder
from kvsched.plugins.discovery import load_policy

Observer = Callable[[StepReport], None]


@dataclass
class RunResult:
    engine: Engine
    requests: list[RequestMetrics] | RequestTable  # a RequestTable when the records were streamed
    summary: dict[str, Any]


def run_simulation(
    requests: Iterable[Request],
    policy: str | Any = "vllm-default",
    config: EngineConfig | None = None,
    profile: str = "llama2-7b-a100",
    policy_options: dict[str, Any] | None = None,
    on_step: Observer | None = None,
    stream_to: Path | None = None,
    **summary_extra: Any,
) -> RunResult:
    """Run ``requests`` through a simulated engine and summarize; deterministic for equal inputs.

    The engine runs as the fleet of one (``cluster/fleet_of_one.py``), whose loop hands over the groups as they end
    (``metrics/records.py``'s ``RequestLog`` makes their records). With ``stream_to`` (a folder), ``requests`` come in
    arrival order (a generator is read as they arrive) and the records are streamed to ``stream_to/requests.parquet``;
    ``RunResult.requests`` is then a ``RequestTable`` on it. ``requests`` may instead be a workload that drives the
    engine itself (``drive(engine, on_step, serving_seconds)``: inference-perf's client, whose next requests depend
    on the engine's answers).
    """
    config = config or EngineConfig()
    executor = SimulatedExecutor(profile)
    engine = Engine(config, policy, executor, policy_options=policy_options)
    streaming = stream_to is not None
    log = RequestLog(Path(stream_to) / "requests.parquet" if streaming else None)
    drive = getattr(requests, "drive", None)  # a workload that answers the engine (workloads/client_loop.py)
    try:
        if drive is not None:  # it adds requests and steps the engine itself: the log takes what ended from it
            take = log.taker(engine)  # streamed: after each step
            drive(engine, fan_out([take, on_step]) if streaming else on_step, executor.profile.serving_seconds)
            take()  # what ended since (aborts between steps), or, in memory, every group
            records = log.close()
        else:
            ordered = requests if streaming else sorted(requests, key=lambda r: r.arrival_time)
            records = FleetOfOne(engine, log, on_step).run(ordered)
    except BaseException:
        log.abandon()
        raise
    summary = summarize(engine, records, profile=executor.profile.name, **summary_extra)
    return RunResult(engine, records, summary)


def fan_out(observers: list[Observer | None]) -> Observer | None:
    """One ``on_step`` callable for several observers (None for none; one made by ``fan_out`` is opened
    up); it takes steady runs (``on_steps``) if every one of them does."""
    flat = [inner for o in observers if o is not None for inner in getattr(o, "observers", (o,))]
    if len(flat) < 2:
        return flat[0] if flat else None

    def observe(report: StepReport) -> None:
        for o in flat:
            o(report)

    observe.observers = flat
    if all(hasattr(o, "on_steps") for o in flat):

        def on_steps(run: StepRun) -> None:
            for o in flat:
                o.on_steps(run)

        observe.on_steps = on_steps
    return observe


class FinishedCount:
    """Tells ``callback`` how many requests each step (or steady run) finished: what a progress bar counts."""

    def __init__(self, callback: Callable[[int], object]) -> None:
        self.callback = callback

    def __call__(self, report: StepReport | StepRun) -> None:
        if report.finished:
            self.callback(len(report.finished))

    on_steps = __call__


@dataclass
class SimOutcome:
    result: RunResult
    timeseries: TimeSeriesRecorder | None
    wall_s: float
    simulate_s: float  # engine loop only (no workload building)
    num_requests: int
    decision_log: Path | None = None  # decisions.parquet, when the job kept one
    lifecycle: dict[str, dict] | None = None  # inference-perf's report files, when its workload drove the run

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
    stream_to: Path | None = None  # stream records and time series to this folder (bounded memory)
    decision_log: Path | None = None  # write the decision log (Parquet) here as the run goes

    def run(self, on_step: Observer | None = None, on_start: Callable[[int], None] | None = None) -> SimOutcome:
        """Build the requests, tell ``on_start`` how many, simulate, and extend the summary."""
        start = time.perf_counter()
        streaming = self.stream_to is not None
        if streaming:
            Path(self.stream_to).mkdir(parents=True, exist_ok=True)
        driven = hasattr(self.workload, "drive")
        if driven:  # it sends its requests itself, as answers come back
            requests: Iterable[Request] = self.workload
            count = self.workload.num_requests
        elif streaming:
            requests = self.workload.iter_requests()
            count = self.workload.num_requests
        else:
            requests = sorted(self.workload.requests(), key=lambda r: r.arrival_time)
            count = len(requests)
        if on_start is not None:
            on_start(count)
        series = None
        if self.record_timeseries:
            series = TimeSeriesRecorder(Path(self.stream_to) / "timeseries.parquet" if streaming else None)
        service = TenantService()
        tenants = self.workload.tenant_names() if streaming or driven else {r.tenant for r in requests}
        competing = len(tenants) > 1
        if competing:
            requests = service.watch(requests)
        log = DecisionLog(self.decision_log) if self.decision_log is not None else None
        profile = resolve_profile(self.profile)
        policy = load_policy(self.policy) if isinstance(self.policy, str) else self.policy
        config = fit_to_profile(self.config, profile, policy)
        sim_start = time.perf_counter()
        description = self.workload.describe()
        try:
            result = run_simulation(
                requests,
                self.policy,
                config,
                profile,
                self.policy_options,
                on_step=fan_out([series, service if competing else None, log, on_step]),
                stream_to=self.stream_to,
                seed=description.get("seed"),
                workload=description,
            )
        except BaseException:
            if series is not None and series.file is not None:
                series.file.abandon()
            if log is not None:
                log.discard()
            raise
        if series is not None:
            series.close()
        simulate_s = time.perf_counter() - sim_start
        s = result.summary
        s["defaults"] = filled_settings(self.config, profile, policy)
        slo = self.slo_ttft is not None or self.slo_tpot is not None  # no target, no goodput to speak of
        s["slo"] = goodput_summary(result.requests, s["duration_s"], self.slo_ttft, self.slo_tpot) if slo else None
        s["fairness"] = fairness_summary(result.requests, service)
        if series is not None and len(series):
            s["kv_usage"] = series.kv_usage(result.engine.config.num_gpu_blocks)
        log_path = log.close() if log is not None else None
        lifecycle = None
        if getattr(self.workload, "client_log", None) is not None:
            lifecycle = run_reports(self.workload, result.requests, profile.serving_seconds)
        return SimOutcome(result, series, time.perf_counter() - start, simulate_s, count, log_path, lifecycle)
