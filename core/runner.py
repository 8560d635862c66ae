"""One simulation job: build the engine, feed the workload, collect metrics, write the results folder."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvsched.core.config import EngineConfig
from kvsched.core.engine import Engine
from kvsched.core.executors.simulated import SimulatedExecutor
from kvsched.core.metrics import RequestMetrics, summarize
from kvsched.core.report import StepReport
from kvsched.core.request import Request


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
    executor = SimulatedExecutor(profile, block_size=config.block_size)
    engine = Engine(config, policy, executor, policy_options)
    engine.run(requests, on_step=on_step)
    metrics = [RequestMetrics.of(g) for g in engine.groups.values()]
    summary = summarize(engine, metrics, profile=executor.profile.name, **summary_extra)
    return RunResult(engine, metrics, summary)


def write_results(result: RunResult, directory: Path) -> list[Path]:
    """``summary.json`` and ``requests.csv`` under ``directory`` (created if needed)."""
    directory.mkdir(parents=True, exist_ok=True)
    summary_path = directory / "summary.json"
    summary_path.write_text(json.dumps(result.summary, indent=2, sort_keys=False) + "\n")
    requests_path = directory / "requests.csv"
    rows = [m.as_dict() for m in result.requests]
    with requests_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["request_id"])
        writer.writeheader()
        writer.writerows(rows)
    return [summary_path, requests_path]
