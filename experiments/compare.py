"""Policy comparison: the same workloads under several policies, side by side (``engine compare``).

Each policy runs every seed's workload; the table gives each metric's mean over the seeds with
its 95% confidence interval (Student's t), so a difference smaller than the intervals is not read
as a win. A workload that does not depend on its seed (a trace replay) runs once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvsched.core.config import EngineConfig
from kvsched.core.plugins import load_policy, policy_name
from kvsched.metrics.confidence import mean_interval

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
    """One policy over every seed: a summary per seed, latencies pooled over the seeds."""

    policy: str
    summaries: list[dict[str, Any]] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)


def metric(summary: dict, key: str, field: str | None) -> float | None:
    """One number of a summary (None where the run could not know it: preemptions, measured from a client)."""
    value = summary.get(key)
    if value is None:
        return None
    if key == "preemptions":
        return value["recompute"] + value["swap"]
    return value if field is None else value[field]


def distinct_workloads(workloads: list) -> list:
    """``workloads`` (one per seed), or only the first when the seed does not change its requests."""
    if len(workloads) > 1 and workloads[1].requests() == workloads[0].requests():
        return workloads[:1]
    return workloads


MAX_SEEDS = 1_000  # seeds a comparison runs at most: each one a run per policy


def seed_workloads(build: Callable[[int], Any], seed: int, seeds: int) -> list:
    """The workloads of seeds ``seed`` .. ``seed + seeds - 1`` built by ``build(seed)``, or only the
    first when the seed does not change its requests; ``seeds`` is checked before any is built."""
    if not 1 <= seeds <= MAX_SEEDS:
        raise ValueError(f"--seeds must be between 1 and {MAX_SEEDS:,}, got {seeds:,}")
    first = distinct_workloads([build(s) for s in range(seed, seed + min(seeds, 2))])
    return first if len(first) < 2 else first + [build(s) for s in range(seed + 2, seed + seeds)]


def run_policies(policies: list[str], workloads: list, config: EngineConfig, profile: str,
                 options: dict[str, dict[str, Any]] | None = None, on_done: Callable[[], None] | None = None) -> list[PolicyRun]:
    """Simulate each of ``workloads`` (one per seed, the same for every policy) once per policy; ``on_done`` after each."""
    from kvsched.experiments.simulation import SimJob

    runs = []
    for name in policies:
        run = PolicyRun(policy_name(name, load_policy(name)))  # a policy file is shown by its class's name, as engine run shows it
        for workload in workloads:
            outcome = SimJob(workload, name, config, profile, (options or {}).get(name), record_timeseries=False).run()
            run.summaries.append(outcome.summary)
            done = [r for r in outcome.result.requests if r.ttft is not None]
            run.ttft += [r.ttft for r in done]
            run.tpot += [r.tpot for r in done if r.tpot is not None]
            if on_done is not None:
                on_done()
        runs.append(run)
    return runs


def table_rows(runs: list[PolicyRun]) -> list[list[str]]:
    """One row per metric; the first column is the label, then one cell per policy (mean ± 95% CI over seeds)."""
    rows = []
    for label, key, part, scale, fmt in ROWS:
        cells = [label]
        for run in runs:
            values = [metric(s, key, part) for s in run.summaries]
            if any(v is None for v in values):
                cells.append("-")
                continue
            mean, half = mean_interval([v * scale for v in values])
            cells.append(fmt.format(mean) + (f" ± {fmt.format(half)}" if len(values) > 1 else ""))
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
