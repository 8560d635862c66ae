"""The leaderboard: policies × workloads × seeds, each cell a metric's mean with its 95% interval (``engine leaderboard``).

The runs are a sweep's (``experiments/sweep.py``: one process pool per workload and seed, a point
per policy), the seeds and the intervals a comparison's (``experiments/compare.py``: a workload that
does not depend on its seed runs once; Student's t over the seeds), so a cell says what ``engine
compare`` says for the same runs. Each workload ranks the policies by a primary metric. With a
served engine (``--real``) each workload is also replayed once through ``engine bench``'s client, and
its measured numbers sit beside the simulated ones, unranked: the simulator's prediction against
what the engine did.
"""

from __future__ import annotations

import math
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvsched.metrics.confidence import mean_interval

LEVEL = 0.95  # the confidence of every interval


@dataclass(frozen=True)
class Metric:
    """A column of the board: a ``experiments.sweep.METRICS`` name, shown scaled, with the better direction."""

    key: str
    label: str
    unit: str
    scale: float
    fmt: str
    lower_is_better: bool = True

    def show(self, value: float) -> str:
        return self.fmt.format(value * self.scale)


METRICS = {m.key: m for m in (
    Metric("ttft_mean_s", "TTFT mean", "s", 1, "{:.3f}"),
    Metric("ttft_p50_s", "TTFT p50", "s", 1, "{:.3f}"),
    Metric("ttft_p99_s", "TTFT p99", "s", 1, "{:.3f}"),
    Metric("tpot_mean_s", "TPOT mean", "ms", 1000, "{:.1f}"),
    Metric("tpot_p99_s", "TPOT p99", "ms", 1000, "{:.1f}"),
    Metric("e2e_p50_s", "E2E p50", "s", 1, "{:.2f}"),
    Metric("e2e_p99_s", "E2E p99", "s", 1, "{:.2f}"),
    Metric("output_tokens_per_s", "throughput", "tok/s", 1, "{:.0f}", lower_is_better=False),
    Metric("requests_per_s", "throughput", "req/s", 1, "{:.3f}", lower_is_better=False),
    Metric("recompute_tax", "recompute tax", "%", 100, "{:.1f}"),
    Metric("preempt_recompute", "preemptions", "", 1, "{:.0f}"),
    Metric("finished", "finished", "", 1, "{:.0f}", lower_is_better=False),
)}
DEFAULT_METRICS = ("ttft_mean_s", "ttft_p99_s", "e2e_p50_s", "e2e_p99_s", "output_tokens_per_s", "recompute_tax")
DEFAULT_POLICIES = ("vllm-v1", "lcf", "residual-sjf", "session-affinity", "cache-affinity", "ewsjf", "sjf-aging", "sla-tiers", "hrrn")
# The Azure conversation trace at 3x its recorded rate (its own arrival times: one run, whatever the seeds) and
# ShareGPT's lengths at 6 req/s Poisson (a run per seed): queues build on both, which is where orderings differ
# (docs/policies: ShareGPT at 1.5-3 req/s never queues)
DEFAULT_WORKLOADS = ("azure-conv@x3", "sharegpt@6")
DEFAULT_REQUESTS = 200  # of a built-in trace, without -n: a board of the defaults in a few minutes on two cores
MAX_RUNS = 10_000  # simulations a board runs at most, counted before any


def check_metrics(names: list[str]) -> list[Metric]:
    """The board's metrics by name; an unknown name is a ``ValueError`` listing the known ones."""
    unknown = [n for n in names if n not in METRICS]
    if unknown:
        raise ValueError(f"unknown --metric {unknown[0]!r}: choose from {', '.join(METRICS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"--metric {', '.join(sorted({n for n in names if names.count(n) > 1}))} given twice")
    return [METRICS[n] for n in names]


@dataclass(frozen=True)
class BoardWorkload:
    """A column group: a workload (built-in name or .json spec) and, after ``@``, its Poisson rate in req/s
    (``sharegpt@6``) or, after ``@x``, a scale of its recorded arrival times (``azure-conv@x1.5``)."""

    text: str
    name: str
    rate: float | None
    rate_scale: float = 1.0

    @classmethod
    def parse(cls, text: str, rate: float | None = None) -> BoardWorkload:
        name, sep, given = text.rpartition("@") if "@" in text else (text, "", "")
        scale = 1.0
        if sep:
            try:
                number = float(given[1:] if given.startswith("x") else given)
            except ValueError:
                raise ValueError(f"--workload {text!r}: after @ comes a rate in req/s (@6) or a rate scale (@x1.5), got {given!r}") from None
            if not (math.isfinite(number) and number > 0):
                raise ValueError(f"--workload {text!r}: the number after @ must be positive")
            rate, scale = (rate, number) if given.startswith("x") else (number, 1.0)
        if not name:
            raise ValueError(f"--workload {text!r}: give a workload name before @")
        return cls(text, name, rate, scale)

    def options(self, num_requests: int | None, seed: int) -> dict[str, Any]:
        """``build_workload``'s keyword arguments for one seed (a sweep spec's workload); without
        ``num_requests`` a built-in trace gives its first ``DEFAULT_REQUESTS``, a spec its own count."""
        from kvsched.workloads.builtin import BUILTIN_TRACES

        if num_requests is None and self.name in BUILTIN_TRACES:
            num_requests = DEFAULT_REQUESTS
        return {"workload": self.name, "num_requests": num_requests, "rate": self.rate, "rate_scale": self.rate_scale, "seed": seed}


@dataclass
class Board:
    """Every run's metrics: ``rows[workload][policy]`` is one sweep row per seed."""

    policies: list[str]
    workloads: list[BoardWorkload]
    metrics: list[Metric]
    primary: Metric
    seeds: dict[str, list[int]] = field(default_factory=dict)  # by workload: the seeds run (one for a seedless one)
    described: dict[str, dict] = field(default_factory=dict)  # by workload: its description
    rows: dict[str, dict[str, list[dict]]] = field(default_factory=dict)
    measured: dict[str, dict[str, Any]] = field(default_factory=dict)  # by workload: the served engine's metrics

    def cell(self, workload: str, policy: str, metric: Metric) -> dict[str, Any] | None:
        """Mean, 95% interval and n of ``metric`` over the seeds, as ``engine compare`` computes it; None
        where a run has no such number (no preemption, so no tax: a tax of 0 is a number)."""
        values = [row[metric.key] for row in self.rows[workload][policy]]
        if any(v is None or not math.isfinite(v) for v in values):
            return None
        mean, half = mean_interval(values, LEVEL)
        return {"mean": mean, "low": mean - half, "high": mean + half, "half_width": half, "n": len(values), "values": values}

    def _score(self, workload: str, policy: str, metric: Metric) -> float | None:
        """The mean of ``metric`` signed so that smaller is better, or None."""
        c = self.cell(workload, policy, metric)
        return None if c is None else (c["mean"] if metric.lower_is_better else -c["mean"])

    def ranks(self, workload: str) -> dict[str, int]:
        """Each policy's rank by the primary metric's mean, 1 the best, equal means equal ranks (1, 1, 3);
        the policies without the number after all the others, in the order given."""
        scores = {p: self._score(workload, p, self.primary) for p in self.policies}
        order = sorted(self.policies, key=lambda p: (scores[p] is None, scores[p] or 0.0))
        ranks: dict[str, int] = {}
        for i, p in enumerate(order):
            before = order[i - 1] if i else None
            ranks[p] = ranks[before] if before is not None and scores[p] is not None and scores[p] == scores[before] else i + 1
        return ranks

    def best(self, workload: str, metric: Metric) -> list[str]:
        """The policies with the best mean of ``metric`` on ``workload`` (several where they tie)."""
        scores = {p: self._score(workload, p, metric) for p in self.policies}
        known = [v for v in scores.values() if v is not None]
        return [p for p, v in scores.items() if known and v == min(known)]


def plan(policies: list[str], workloads: list[BoardWorkload], num_requests: int | None, seed: int, seeds: int,
         profile: str) -> tuple[dict[str, list[int]], dict[str, dict]]:
    """Check every policy, workload and the profile, and find each workload's seeds (one where the seed
    does not change its requests), before anything runs."""
    from kvsched.core.plugins import load_policy
    from kvsched.executors.profiles import resolve_profile
    from kvsched.experiments.compare import seed_workloads
    from kvsched.workloads import build_workload

    if len(set(policies)) != len(policies):
        raise ValueError(f"--policy {', '.join(sorted({p for p in policies if policies.count(p) > 1}))} given twice")
    if len({w.text for w in workloads}) != len(workloads):
        raise ValueError("a --workload is given twice")
    for name in policies:
        load_policy(name)
    resolve_profile(profile)
    seed_lists, described = {}, {}
    for w in workloads:
        loads = seed_workloads(lambda s, w=w: build_workload(**w.options(num_requests, s)), seed, seeds)
        seed_lists[w.text] = list(range(seed, seed + len(loads)))
        described[w.text] = loads[0].describe()
    runs = len(policies) * sum(map(len, seed_lists.values()))
    if runs > MAX_RUNS:
        raise ValueError(f"the board has {runs:,} runs (policies × workloads × seeds); at most {MAX_RUNS:,}")
    return seed_lists, described


def run_board(board: Board, num_requests: int | None, profile: str, workers: int | None = None,
              on_done: Callable[[dict], None] | None = None) -> Board:
    """Simulate every policy on every workload and seed of ``board`` (``plan``'s seeds), a sweep per workload and seed."""
    from kvsched.experiments.sweep import Point, SweepSpec, run_sweep

    points = [Point(p, {}) for p in board.policies]
    for w in board.workloads:
        runs: dict[str, list[dict]] = {p: [] for p in board.policies}
        for s in board.seeds[w.text]:
            for row in run_sweep(SweepSpec(w.options(num_requests, s), profile=profile), points, workers, on_done):
                runs[row["policy"]].append(row)
        board.rows[w.text] = runs
    return board


def measure(board: Board, url: str, num_requests: int | None, label: str | None, model: str | None = None,
            api_key: str = "EMPTY", on_done: Callable[[Any], None] | None = None) -> None:
    """Replay each workload (its first seed) once against the served engine at ``url``, as ``engine bench``
    does, and keep its metrics beside the simulated cells."""
    from kvsched.experiments.bench import measured, replay, served_model
    from kvsched.experiments.sweep import summary_metrics
    from kvsched.workloads import build_workload

    model = model or served_model(url, api_key)
    for w in board.workloads:
        load = build_workload(**w.options(num_requests, board.seeds[w.text][0]))
        _, summary = measured(url, model, load, replay(url, model, load.requests(), api_key, on_done), label)
        board.measured[w.text] = {"label": label or url, "url": url, "model": model, "seed": board.seeds[w.text][0],
                                  "metrics": summary_metrics(summary), "finished": summary["finished"],
                                  "aborted": summary["aborted"]}


def versions() -> dict[str, str]:
    """What produced the numbers: kvsched's version and the interpreter's."""
    import numpy

    from kvsched import __version__

    return {"kvsched": __version__, "python": platform.python_version(), "numpy": numpy.__version__, "platform": platform.platform()}


def board_json(board: Board, command: str, profile: str, num_requests: int | None) -> dict[str, Any]:
    """``leaderboard.json``: every cell with its mean, 95% interval, n and per-seed values, the ranking per
    workload, and the command and versions that produced them all."""
    cells = []
    for w in board.workloads:
        for p in board.policies:
            warnings = sorted({x for row in board.rows[w.text][p] for x in filter(None, row["warnings"].split("; "))})
            for m in board.metrics:
                c = board.cell(w.text, p, m)
                cells.append({"workload": w.text, "policy": p, "metric": m.key, **(c or {"mean": None, "n": 0}),
                              "seeds": board.seeds[w.text], "warnings": warnings})
    return {
        "command": command, "versions": versions(), "level": LEVEL, "profile": profile, "num_requests": num_requests,
        "primary": board.primary.key,
        "metrics": [{"key": m.key, "label": m.label, "unit": m.unit, "scale": m.scale, "decimals": int(m.fmt[-3]),
                     "better": "lower" if m.lower_is_better else "higher"} for m in board.metrics],
        "policies": board.policies,
        "workloads": [{"key": w.text, "name": w.name, "rate": w.rate, "rate_scale": w.rate_scale, "seeds": board.seeds[w.text],
                       "description": board.described[w.text]} for w in board.workloads],
        "ranks": {w.text: board.ranks(w.text) for w in board.workloads},
        "best": {w.text: {m.key: board.best(w.text, m) for m in board.metrics} for w in board.workloads},
        "cells": cells,
        "measured": [{"workload": w, **m} for w, m in board.measured.items()],
    }


def command_line(argv: list[str] | None = None) -> str:
    """The command as typed (``engine leaderboard ...``), quoted for a shell."""
    import shlex

    args = sys.argv[1:] if argv is None else argv
    return shlex.join(["engine", *args])
