"""The leaderboard: policies × workloads × seeds, each cell a metric's mean with its 95% interval, each policy's
paired change against a baseline, and ranks that say when they are resolved (``engine leaderboard``).

The runs are a sweep's (``experiments/sweep.py``: one process pool per workload and seed, a point
per policy), the seeds and the statistics a comparison's (``experiments/compare.py``: a workload that
does not depend on its seed runs once; ``experiments/evidence.py``'s paired statistics), so a cell says
what ``engine compare`` says for the same runs. Each workload ranks the policies by a primary metric,
and so does every workload together (every workload and seed a paired unit). With a served engine
(``--real``) each workload is also replayed once through ``engine bench``'s client, and its measured
numbers sit beside the simulated ones, unranked: the simulator's prediction against what the engine did.
"""

from __future__ import annotations

import math
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvsched.experiments.compare import Contender
from kvsched.experiments.evidence import Contest, Metric, cell_text, change_text, rank_text
from kvsched.metrics.confidence import LEVEL

DEFAULT_METRICS = (
    "ttft_mean_s",
    "ttft_p99_s",
    "e2e_p50_s",
    "e2e_p99_s",
    "output_tokens_per_s",
    "recompute_tax",
    "dropped_share",
)
DEFAULT_POLICIES = (
    "vllm-v1",
    "lcf",
    "residual-sjf",
    "session-affinity",
    "cache-affinity",
    "ewsjf",
    "sjf-aging",
    "sla-tiers",
    "hrrn",
)
# ShareGPT's lengths cut to the model's context (nothing ignored) at 2.5 req/s Poisson, where KV blocks run short and
# requests are preempted; multi-turn sessions on shared system prompts in three SLO tiers (the prefix-aware and the
# tiered proposals' workload), KV pressure on both. Queues build on both, which is where orderings differ.
DEFAULT_WORKLOADS = ("sharegpt-4k@2.5", "tiered-sessions")
DEFAULT_REQUESTS = 200  # of a built-in trace, without -n: a board of the defaults in a few minutes on two cores
MAX_RUNS = 10_000  # simulations a board runs at most, counted before any


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
                raise ValueError(
                    f"--workload {text!r}: after @ comes a rate in req/s (@6) or a rate scale (@x1.5), got {given!r}"
                ) from None
            if not (math.isfinite(number) and number > 0):
                raise ValueError(f"--workload {text!r}: the number after @ must be positive")
            rate, scale = (rate, number) if given.startswith("x") else (number, 1.0)
        if not name:
            raise ValueError(f"--workload {text!r}: give a workload name before @")
        return cls(text, name, rate, scale)

    def options(self, num_requests: int | None, seed: int) -> dict[str, Any]:
        """``build_workload``'s keyword arguments for one seed (a sweep spec's workload); without
        ``num_requests`` a built-in trace (or named spec of one) gives its first ``DEFAULT_REQUESTS``, a spec its own
        count."""
        from kvsched.workloads.builtin import is_trace

        if num_requests is None and is_trace(self.name):
            num_requests = DEFAULT_REQUESTS
        return {
            "workload": self.name,
            "num_requests": num_requests,
            "rate": self.rate,
            "rate_scale": self.rate_scale,
            "seed": seed,
        }


@dataclass
class Board:
    """Every run's metrics: ``rows[workload][policy]`` is one sweep row per seed; a policy is told by its label
    (its name, and its options: ``lcf:victim=mcf``)."""

    contenders: list[Contender]
    labels: list[str]
    workloads: list[BoardWorkload]
    metrics: list[Metric]
    primary: Metric
    baseline: str
    seeds: dict[str, list[int]] = field(default_factory=dict)  # by workload: the seeds run (one for a seedless one)
    described: dict[str, dict] = field(default_factory=dict)  # by workload: its description
    settings: dict[str, str] = field(default_factory=dict)  # --set, on every run
    rows: dict[str, dict[str, list[dict]]] = field(default_factory=dict)
    measured: dict[str, dict[str, Any]] = field(default_factory=dict)  # by workload: the served engine's metrics

    @property
    def policies(self) -> list[str]:
        return self.labels

    def contest(self, workload: str | None = None) -> Contest:
        """One workload's runs as a ``Contest`` (its seeds the units), or, with None, every workload's together."""
        keys = [workload] if workload is not None else [w.text for w in self.workloads]
        return Contest({p: [row for k in keys for row in self.rows[k][p]] for p in self.labels}, self.baseline)


def plan(
    policies: list[Contender],
    workloads: list[BoardWorkload],
    num_requests: int | None,
    seed: int,
    seeds: int,
    profile: str,
) -> tuple[dict[str, list[int]], dict[str, dict]]:
    """Check every policy, workload and the profile, and find each workload's seeds (one where the seed
    does not change its requests), before anything runs."""
    from kvsched.executors.profiles import resolve_profile
    from kvsched.experiments.compare import seed_workloads
    from kvsched.plugins.discovery import load_policy
    from kvsched.workloads import build_workload

    texts = [p.text for p in policies]
    if len(set(texts)) != len(texts):
        raise ValueError(f"--policy {', '.join(sorted({p for p in texts if texts.count(p) > 1}))} given twice")
    if len({w.text for w in workloads}) != len(workloads):
        raise ValueError("a --workload is given twice")
    for p in policies:
        load_policy(p.spec)
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


def run_board(
    board: Board,
    num_requests: int | None,
    profile: str,
    workers: int | None = None,
    on_done: Callable[[dict], None] | None = None,
) -> Board:
    """Simulate every policy on every workload and seed of ``board`` (``plan``'s seeds), a sweep per workload and
    seed."""
    from kvsched.experiments.evidence import dropped_share
    from kvsched.experiments.sweep import Point, SweepSpec, run_sweep

    points = [Point(c.spec, {}, c.options) for c in board.contenders]
    for w in board.workloads:
        runs: dict[str, list[dict]] = {p: [] for p in board.labels}
        for s in board.seeds[w.text]:
            rows = run_sweep(
                SweepSpec(w.options(num_requests, s), base_settings=board.settings, profile=profile),
                points,
                workers,
                on_done,
            )
            for label, row in zip(board.labels, rows):  # a sweep's rows come back in the order of its points
                runs[label].append({**row, "dropped_share": dropped_share(row, row.get("num_requests"))})
        board.rows[w.text] = runs
    return board


def measure(
    board: Board,
    url: str,
    num_requests: int | None,
    label: str | None,
    model: str,
    api_key: str = "EMPTY",
    on_done: Callable[[Any], None] | None = None,
    *,
    timeout: float,
    warn: Callable[[str], None] | None = None,
) -> None:
    """Replay each workload (its first seed) once against the served engine at ``url`` (serving ``model``), as
    ``engine bench`` does, and keep its metrics beside the simulated cells; ``warn`` hears of a workload
    that does not fit the server's context (``max_model_len``, None if the server does not say) before its replay."""
    from kvsched.experiments.bench import measured, misfits, replay, served
    from kvsched.experiments.sweep import summary_metrics
    from kvsched.workloads import build_workload

    context = served(url, api_key, model, timeout=timeout).max_model_len
    for w in board.workloads:
        load = build_workload(**w.options(num_requests, board.seeds[w.text][0]))
        requests = load.requests()
        note = misfits(requests, context)
        if note and warn is not None:
            warn(f"{w.text}: {note}")
        _, summary = measured(url, model, load, replay(url, model, requests, api_key, on_done, timeout=timeout), label)
        board.measured[w.text] = {
            "label": label or url,
            "url": url,
            "model": model,
            "seed": board.seeds[w.text][0],
            "metrics": summary_metrics(summary),
            "finished": summary["finished"],
            "aborted": summary["aborted"],
            "ignored": summary["ignored"],
        }


def versions() -> dict[str, str]:
    """What produced the numbers: kvsched's version and the interpreter's."""
    import numpy

    from kvsched import __version__

    return {
        "kvsched": __version__,
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "platform": platform.platform(),
    }


def board_json(board: Board, command: str, profile: str, num_requests: int | None) -> dict[str, Any]:
    """``leaderboard.json``: every cell with its mean, 95% interval, n and per-seed values, each policy's paired change
    against the baseline, the rank ranges per workload and over every workload, and the command and versions."""
    cells = []
    for w in board.workloads:
        game = board.contest(w.text)
        for p in board.labels:
            warnings = sorted({x for row in board.rows[w.text][p] for x in filter(None, row["warnings"].split("; "))})
            for m in board.metrics:
                c, change = game.cell(p, m), game.change(p, m)
                cells.append(
                    {
                        "workload": w.text,
                        "policy": p,
                        "metric": m.key,
                        **(c.as_dict() if c else {"mean": None, "n": 0}),
                        "values": game.values(p, m),
                        "text": cell_text(c, m),
                        "change": change.as_dict() | {"text": change_text(change, m)} if change else None,
                        "seeds": board.seeds[w.text],
                        "warnings": warnings,
                    }
                )
    pooled = board.contest()
    return {
        "command": command,
        "versions": versions(),
        "level": LEVEL,
        "profile": profile,
        "num_requests": num_requests,
        "settings": board.settings,
        "primary": board.primary.key,
        "baseline": board.baseline,
        "metrics": [
            {
                "key": m.key,
                "label": m.label,
                "unit": m.unit,
                "scale": m.scale,
                "decimals": m.decimals,
                "better": "lower" if m.lower_is_better else "higher",
            }
            for m in board.metrics
        ],
        "policies": board.labels,
        "options": {label: c.options for label, c in zip(board.labels, board.contenders)},
        "workloads": [
            {
                "key": w.text,
                "name": w.name,
                "rate": w.rate,
                "rate_scale": w.rate_scale,
                "seeds": board.seeds[w.text],
                "description": board.described[w.text],
            }
            for w in board.workloads
        ],
        "ranks": {w.text: _ranks(board.contest(w.text), board.primary) for w in board.workloads},
        "best": {w.text: {m.key: board.contest(w.text).best(m) for m in board.metrics} for w in board.workloads},
        "cells": cells,
        "overall": {
            "ranks": _ranks(pooled, board.primary),
            "units": pooled.units,
            "changes": {
                p: {
                    m.key: ch.as_dict() | {"text": change_text(ch, m)} if (ch := pooled.change(p, m)) else None
                    for m in board.metrics
                }
                for p in board.labels
            },
        },
        "measured": [
            {"workload": w, **m, "texts": {x.key: _one_run(m["metrics"].get(x.key), x) for x in board.metrics}}
            for w, m in board.measured.items()
        ],
    }


def _one_run(value: float | None, metric: Metric) -> str:
    """A measured number as a cell shows it (– for what a client cannot see)."""
    from kvsched.metrics.confidence import Estimate

    return cell_text(None if value is None else Estimate(value, value, value, 1), metric)


def _ranks(game: Contest, metric: Metric) -> dict[str, dict[str, Any]]:
    """Each policy's rank range by ``metric``: best and worst it could hold, and as text (``3``, ``2–5``)."""
    return {
        p: {"best": best, "worst": worst, "text": rank_text(best, worst)}
        for p, (best, worst) in game.ranks(metric).items()
    }


def command_line(argv: list[str] | None = None) -> str:
    """The command as typed (``engine leaderboard ...``), quoted for a shell."""
    import shlex

    args = sys.argv[1:] if argv is None else argv
    return shlex.join(["engine", *args])
