"""Policy comparison: the same workload under several policies, side by side (``engine compare``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvsched.core.config import EngineConfig

# (label, summary key, field, scale, format): the rows of the comparison table
ROWS = (
    ("finished", "finished", None, 1, "{:.0f}"),
    ("throughput (req/s)", "requests_per_s", None, 1, "{:.3f}"),
    ("throughput (tok/s)", "throughput_tokens_per_s", None, 1, "{:.0f}"),
    ("TTFT mean (s)", "ttft_s", "mean", 1, "{:.3f}"),
    ("TTFT p50 (s)", "ttft_s", "p50", 1, "{:.3f}"),
    ("TTFT p99 (s)", "ttft_s", "p99", 1, "{:.3f}"),
    ("TPOT mean (ms)", "tpot_s", "mean", 1000, "{:.1f}"),
    ("TPOT p99 (ms)", "tpot_s", "p99", 1000, "{:.1f}"),
    ("e2e p99 (s)", "e2e_s", "p99", 1, "{:.2f}"),
    ("preemptions", "preemptions", None, 1, "{:.0f}"),
)


@dataclass
class PolicyRun:
    policy: str
    summary: dict[str, Any]
    ttft: list[float]
    tpot: list[float]


def metric(summary: dict, key: str, field: str | None) -> float | None:
    value = summary[key]
    if key == "preemptions":
        return value["recompute"] + value["swap"]
    return value if field is None else value[field]


def run_policies(policies: list[str], workload, config: EngineConfig, profile: str,
                 options: dict[str, dict[str, Any]] | None = None) -> list[PolicyRun]:
    """Simulate ``workload`` (same requests, same seed) once per policy."""
    from kvsched.experiments.simulation import SimJob

    runs = []
    for name in policies:
        job = SimJob(workload, name, config, profile, (options or {}).get(name), record_timeseries=False)
        outcome = job.run()
        done = [r for r in outcome.result.requests if r.ttft is not None]
        runs.append(PolicyRun(name, outcome.summary, [r.ttft for r in done], [r.tpot for r in done if r.tpot is not None]))
    return runs


def table_rows(runs: list[PolicyRun]) -> list[list[str]]:
    """One row per metric; the first column is the label, then one cell per policy."""
    rows = []
    for label, key, field, scale, fmt in ROWS:
        cells = [label]
        for run in runs:
            value = metric(run.summary, key, field)
            cells.append("-" if value is None else fmt.format(value * scale))
        rows.append(cells)
    return rows


def split_options(pairs: dict[str, str], policies: list[str]) -> dict[str, dict[str, str]]:
    """``POLICY.KEY=VALUE`` options to ``{policy: {key: value}}``; the policy must be one of those compared."""
    out: dict[str, dict[str, str]] = {}
    for dotted, value in pairs.items():
        name, sep, key = dotted.partition(".")
        if not sep or name not in policies:
            raise ValueError(f"--policy-opt for compare is POLICY.KEY=VALUE with POLICY one of {policies}, got {dotted!r}")
        out.setdefault(name, {})[key] = value
    return out
