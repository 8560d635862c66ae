"""Ranked results as evidence: contenders (policies, a policy under two option sets, routers) run on the
same units (a workload at a seed), each metric's mean with its interval, each contender's paired change
against a baseline, and ranks that say when they are resolved.

``engine compare``, ``engine leaderboard``, router comparisons and ``engine capacity`` build their
tables from a ``Contest``; the statistics are ``metrics/confidence.py``'s, and the metrics a unit's
row holds are ``experiments.sweep.METRICS`` plus the share of requests a run did not serve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kvsched.metrics.confidence import LEVEL, RATIO, Change, Estimate, estimate, paired_change, rank_ranges, rank_text

DEFAULT_BASELINE = "vllm-v1"
SIGNIFICANT = "*"  # after a change whose interval excludes no change


@dataclass(frozen=True)
class Metric:
    """A row or column of a ranked table: a unit row's key, shown scaled, with the better direction."""

    key: str
    label: str
    unit: str
    scale: float
    fmt: str
    lower_is_better: bool = True

    def show(self, value: float) -> str:
        return self.fmt.format(value * self.scale)

    @property
    def heading(self) -> str:
        return f"{self.label} ({self.unit})" if self.unit else self.label

    @property
    def decimals(self) -> int:
        return int(self.fmt[-3])


METRICS = {
    m.key: m
    for m in (
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
        Metric("ignored", "ignored", "", 1, "{:.0f}"),
        Metric("aborted", "aborted", "", 1, "{:.0f}"),
        Metric("dropped_share", "not served", "%", 100, "{:.1f}"),
        Metric("prefix_hit_rate", "prefix hits", "%", 100, "{:.1f}", lower_is_better=False),
        Metric("goodput_req_per_s", "SLO goodput", "req/s", 1, "{:.3f}", lower_is_better=False),
        Metric("slo_attainment", "SLO attainment", "%", 100, "{:.1f}", lower_is_better=False),
    )
}


def check_metrics(names: list[str]) -> list[Metric]:
    """Metrics by name; an unknown name is a ``ValueError`` listing the known ones."""
    unknown = [n for n in names if n not in METRICS]
    if unknown:
        raise ValueError(f"unknown --metric {unknown[0]!r}: choose from {', '.join(METRICS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"--metric {', '.join(sorted({n for n in names if names.count(n) > 1}))} given twice")
    return [METRICS[n] for n in names]


def unit_row(summary: dict[str, Any]) -> dict[str, Any]:
    """The metrics of one run's summary (simulated, measured or a fleet's), by ``METRICS`` key, and its classes'
    (``metrics.classes.class_rows``: ``CLASS|METRIC``)."""
    from kvsched.experiments.sweep import summary_metrics
    from kvsched.metrics.classes import class_rows

    row = summary_metrics(summary)
    shares = {
        "dropped_share": dropped_share(row, summary.get("num_requests")),
        "prefix_hit_rate": summary.get("prefix_hit_rate"),
    }
    return {**row, **shares, **class_rows(summary)}


def class_metric(key: str) -> Metric:
    """The metric of a per-class key (``slo_class=interactive|ttft_mean_s``): its base metric, labelled by class."""
    name, _, base = key.rpartition("|")
    m = METRICS[base]
    return Metric(key, f"{m.label} · {name}", m.unit, m.scale, m.fmt, m.lower_is_better)


def dropped_share(row: dict[str, Any], num_requests: int | None) -> float | None:
    """The share of a run's requests it ignored or aborted: what its latencies are not over."""
    if not num_requests or row.get("ignored") is None or row.get("aborted") is None:
        return None
    return (row["ignored"] + row["aborted"]) / num_requests


def choose_baseline(contenders: list[str], given: str | None) -> str:
    """The baseline: ``given`` (one of the contenders), else ``vllm-v1`` when it runs, else the first."""
    if given is not None:
        if given not in contenders:
            raise ValueError(f"--baseline {given!r} is not one of the contenders: {', '.join(contenders)}")
        return given
    return DEFAULT_BASELINE if DEFAULT_BASELINE in contenders else contenders[0]


@dataclass
class Contest:
    """Contenders on the same units: ``rows[contender]`` is one metrics row per unit, in the same unit order."""

    rows: dict[str, list[dict[str, Any]]]
    baseline: str
    level: float = LEVEL

    @property
    def contenders(self) -> list[str]:
        return list(self.rows)

    @property
    def units(self) -> int:
        return len(self.rows[self.baseline])

    def values(self, contender: str, metric: Metric) -> list[float] | None:
        """Its per-unit values, or None where a unit has no such number (a client cannot see the recompute tax)."""
        values = [row.get(metric.key) for row in self.rows[contender]]
        number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)  # noqa: E731
        if not values or not all(map(number, values)):
            return None
        return [float(v) for v in values]

    def cell(self, contender: str, metric: Metric) -> Estimate | None:
        values = self.values(contender, metric)
        return None if values is None else estimate(values, self.level)

    def change(self, contender: str, metric: Metric) -> Change | None:
        """Its paired change against the baseline; None for the baseline itself or a missing number."""
        if contender == self.baseline:
            return None
        values, base = self.values(contender, metric), self.values(self.baseline, metric)
        return None if values is None or base is None else paired_change(values, base, self.level)

    def ranks(self, metric: Metric) -> dict[str, tuple[int, int]]:
        return rank_ranges({c: self.values(c, metric) for c in self.rows}, metric.lower_is_better, self.level)

    def best(self, metric: Metric) -> list[str]:
        """The contenders whose rank by ``metric`` can be 1 and whose mean is the best (several where they tie)."""
        means = {c: e.mean for c in self.rows if (e := self.cell(c, metric)) is not None}
        if not means:
            return []
        top = min(means.values()) if metric.lower_is_better else max(means.values())
        return [c for c, m in means.items() if m == top]

    def as_dict(self, metrics: list[Metric]) -> dict[str, Any]:
        """Every cell, change and rank range of ``metrics`` (for JSON)."""
        return {
            "baseline": self.baseline,
            "units": self.units,
            "level": self.level,
            "metrics": {
                m.key: {
                    "ranks": {c: list(r) for c, r in self.ranks(m).items()},
                    "cells": {
                        c: (e.as_dict() | {"values": self.values(c, m)}) if (e := self.cell(c, m)) else None
                        for c in self.rows
                    },
                    "changes": {c: ch.as_dict() if (ch := self.change(c, m)) else None for c in self.rows},
                }
                for m in metrics
            },
        }


def cell_text(cell: Estimate | None, metric: Metric) -> str:
    """``mean (low–high)`` in the metric's unit (the interval only over several units); – for no number."""
    if cell is None:
        return "–"
    text = metric.show(cell.mean)
    return text if cell.n < 2 else f"{text} ({metric.show(cell.low)}–{metric.show(cell.high)})"


def change_text(change: Change | None, metric: Metric) -> str:
    """``−37% (−52% to −18%)*``: a ratio as a percentage change, a difference in the metric's unit (a
    percentage's as points, pp); the interval only over several units; ``*`` where it is significant."""
    if change is None:
        return "–"
    alike = (change.value, change.low, change.high)
    if all(x in (None, change.neutral) for x in alike) and change.value == change.neutral:
        return "same"  # every run alike (a policy that never acts differently on this workload)
    if change.kind == RATIO:
        show = lambda r: _percent(100 * (r - 1))  # noqa: E731
    else:
        unit = "pp" if metric.unit == "%" else metric.unit
        show = lambda d: f"{d * metric.scale:+.{metric.decimals}f}{(' ' + unit) if unit else ''}"  # noqa: E731
    text = show(change.value)
    if change.low is None:
        return f"{text} (one run)"
    return f"{text} ({show(change.low)} to {show(change.high)}){SIGNIFICANT if change.significant else ''}"


def _percent(x: float) -> str:
    """A percentage change, to the unit past ±10 %, to a tenth below, never ``-0``."""
    text = f"{x:+.0f}%" if abs(x) >= 9.95 else f"{x:+.1f}%"
    return "+0.0%" if text in ("-0.0%", "+0.0%") else text


def rank_cell(ranks: dict[str, tuple[int, int]], contender: str) -> str:
    return rank_text(*ranks[contender])


def statistics_note(level: float = LEVEL) -> str:
    """What a table's intervals, changes and ranks are (printed under every ranked table)."""
    pct = round(100 * level)
    return (
        f"Intervals are {pct}% intervals over the runs (log-transformed: they stay above zero). "
        f"A change is paired, run by run on the same workloads and seeds, against the baseline: "
        f"a ratio's geometric mean as a percentage, or, where a value can be 0, the mean difference; "
        f"{SIGNIFICANT} marks one whose {pct}% interval excludes no change. "
        f"A rank such as 2–4 is not resolved: the paired differences cannot place it more closely."
    )
