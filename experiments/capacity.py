"""Capacity: the highest load each contender (a policy, or a router in front of a fleet) carries within an SLO
(``engine capacity``): the question a designer or an operator brings, "how much more load does it carry at my SLO".

For each contender and seed, the workload's arrival rate is scaled (``rate_scale``: a Poisson rate, a trace's
times, a sessions spec's starts alike) and each load is simulated: it is within the SLO when every bound holds
(``ttft_p99=2``: the run's p99 TTFT at most 2 s; any of ``SLO_METRICS``) and no request was aborted. From the
workload's own rate the scale doubles (or halves) until the SLO changes side, then bisects in log scale until the
two sides are within ``tolerance`` of each other; the capacity is the highest load found within the SLO, as the
requests per second the workload then offers. A load the SLO never holds at (down to 1/1024 of the workload's
rate) is a capacity of 0. The seeds are the paired units: each contender's capacities get
``experiments/evidence.py``'s interval, paired change against the baseline and rank ranges.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvsched.experiments.evidence import Contest, Metric, unit_row

SLO_METRICS = ("ttft_mean", "ttft_p50", "ttft_p99", "tpot_mean", "tpot_p99", "e2e_p50", "e2e_p99")  # in seconds
CAPACITY = Metric("capacity_req_per_s", "capacity", "req/s", 1, "{:.2f}", lower_is_better=False)
MAX_DOUBLINGS = 10  # the scales searched: 1/1024 .. 1024 times the workload's own rate


def parse_slo(texts: list[str]) -> dict[str, float]:
    """``["ttft_p99=2,tpot_p99=0.1"]`` (repeatable, comma-separated) → ``{"ttft_p99_s": 2.0, "tpot_p99_s": 0.1}``."""
    slo: dict[str, float] = {}
    for text in texts:
        for item in filter(None, (part.strip() for part in text.split(","))):
            name, sep, value = item.partition("=")
            if not sep or name not in SLO_METRICS:
                raise ValueError(f"--slo {item!r}: give NAME=SECONDS with NAME one of {', '.join(SLO_METRICS)}")
            try:
                bound = float(value)
            except ValueError:
                raise ValueError(f"--slo {item!r}: {value!r} is not a number of seconds") from None
            if not (math.isfinite(bound) and bound > 0):
                raise ValueError(f"--slo {item!r}: the bound must be a positive number of seconds")
            if f"{name}_s" in slo:
                raise ValueError(f"--slo {name} given twice")
            slo[f"{name}_s"] = bound
    if not slo:
        raise ValueError(f"--slo needs at least one bound, e.g. ttft_p99=2 (names: {', '.join(SLO_METRICS)})")
    return slo


def within(summary: dict[str, Any], slo: dict[str, float]) -> bool:
    """Whether a run met every bound of ``slo`` and aborted nothing (an ignored request is the workload's)."""
    row = unit_row(summary)
    return not row.get("aborted") and all(row.get(key) is not None and row[key] <= bound for key, bound in slo.items())


@dataclass(frozen=True)
class Load:
    """One simulated load: its scale of the workload's rate, the requests per second offered, and the result."""

    scale: float
    offered: float
    within: bool
    goodput: float  # requests per second that finished within every per-request bound the SLO implies


@dataclass
class Search:
    """One contender's search on one seed: each load tried, and the capacity found."""

    loads: list[Load] = field(default_factory=list)

    @property
    def capacity(self) -> float:
        return max((load.offered for load in self.loads if load.within), default=0.0)


def offered_rate(requests: list) -> float:
    """The requests per second a workload offers: its requests over the span of their arrivals."""
    times = [r.arrival_time for r in requests]
    span = max(times) - min(times) if times else 0.0
    return (len(times) - 1) / span if span > 0 else 0.0


def search(try_load: Callable[[float], Load], tolerance: float = 0.05) -> Search:
    """Bracket, then bisect in log scale, the highest scale whose load is within the SLO."""
    found = Search()

    def at(scale: float) -> bool:
        load = try_load(scale)
        found.loads.append(load)
        return load.within

    low, high = None, None
    scale = 1.0
    for _ in range(MAX_DOUBLINGS + 1):
        if at(scale):
            low = scale
            if high is not None:
                break
            scale *= 2
        else:
            high = scale
            if low is not None:
                break
            scale /= 2
    if low is None or high is None:  # never within the SLO, or within it at every load tried
        return found
    while high / low > 1 + tolerance:
        middle = math.sqrt(low * high)
        if at(middle):
            low = middle
        else:
            high = middle
    return found


def run_capacity(
    contenders: list[str],
    seeds: list[int],
    evaluate: Callable[[str, int, float], Load],
    baseline: str,
    tolerance: float = 0.05,
    on_done: Callable[[], None] | None = None,
) -> tuple[dict[str, list[Search]], Contest]:
    """Each contender's search on each seed (``evaluate(contender, seed, scale)`` simulates one load), and the
    capacities as a ``Contest`` (the seeds its paired units)."""
    searches: dict[str, list[Search]] = {}
    for contender in contenders:
        searches[contender] = []
        for seed in seeds:

            def try_load(scale: float, contender=contender, seed=seed) -> Load:
                load = evaluate(contender, seed, scale)
                if on_done is not None:
                    on_done()
                return load

            searches[contender].append(search(try_load, tolerance))
    rows = {c: [{CAPACITY.key: s.capacity} for s in searches[c]] for c in contenders}
    return searches, Contest(rows, baseline)


def goodput_bounds(slo: dict[str, float]) -> tuple[float | None, float | None]:
    """The per-request TTFT and TPOT bounds a goodput counts by: the tightest of each the SLO names."""
    ttft = [v for k, v in slo.items() if k.startswith("ttft")]
    tpot = [v for k, v in slo.items() if k.startswith("tpot")]
    return min(ttft, default=None), min(tpot, default=None)
