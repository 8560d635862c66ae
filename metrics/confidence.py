"""The statistics of every ranked result (``engine compare``, ``leaderboard``, router comparisons, ``capacity``).

Every contender runs the same units (a workload at a seed), so results are compared *paired*, unit by
unit, never as independent samples: the noise a seed puts into both sides cancels.

- ``estimate``: a non-negative quantity's mean over the units with its 95 % interval, log-transformed
  (the Student-t interval of log(mean) by the delta method: ``mean · exp(± t · se / mean)``), so it
  never reaches below zero and widens upwards, as a latency's spread does.
- ``paired_change``: one contender against a baseline over the same units. Where every value on both
  sides is positive, the geometric mean of the per-unit ratios with the t interval of the mean
  log-ratio, exponentiated (a change of −37 % cannot have an interval below −100 %); where a value
  may be zero (a recompute tax, a count of preemptions), the mean of the per-unit differences with
  its t interval, in the metric's units. A change is significant when its interval excludes no change.
- ``rank_ranges``: the ranks each contender could hold given every pairwise paired comparison: a
  contender that is significantly beaten by k others ranks no better than k + 1, and one that
  significantly beats j others no worse than N − j. A rank is resolved when the two agree.

Each interval is a per-comparison 95 % interval (no correction for the number of comparisons).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

LEVEL = 0.95  # the confidence of every interval


@lru_cache(maxsize=64)
def t_critical(df: int, level: float = LEVEL) -> float:
    """The two-sided critical value of Student's t with ``df`` degrees of freedom: P(|T| ≤ x) = ``level``.

    Integrated numerically from the density (no scipy): 12.706 for df = 1, 2.776 for 4, 1.96 as df grows."""
    x = np.linspace(0.0, 700.0 if df == 1 else 60.0, 2_000_001)
    density = (
        math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2))
        / math.sqrt(df * math.pi)
        * (1 + x * x / df) ** (-(df + 1) / 2)
    )
    mass = np.concatenate(([0.0], np.cumsum((density[1:] + density[:-1]) / 2 * np.diff(x))))  # P(0 ≤ T ≤ x)
    return float(np.interp(level / 2, mass, x))


def mean_interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float]:
    """(mean, half-width of its Student-t ``level`` interval); the half-width is 0 for a single value."""
    v = np.asarray(values, dtype=float)
    if len(v) < 2:
        return float(v.mean()), 0.0
    return float(v.mean()), t_critical(len(v) - 1, level) * float(v.std(ddof=1)) / math.sqrt(len(v))


@dataclass(frozen=True)
class Estimate:
    """A non-negative quantity's mean over ``n`` units and its log-transformed interval (``low == high ==
    mean`` for one unit: no interval)."""

    mean: float
    low: float
    high: float
    n: int

    def as_dict(self) -> dict[str, float | int]:
        return {"mean": self.mean, "low": self.low, "high": self.high, "n": self.n}


def estimate(values: Sequence[float], level: float = LEVEL) -> Estimate:
    """The mean of ``values`` (each ≥ 0) with its log-transformed ``level`` interval."""
    v = np.asarray(values, dtype=float)
    if not len(v) or np.any(v < 0) or not np.all(np.isfinite(v)):
        raise ValueError(f"an estimate needs finite values >= 0, got {list(values)}")
    mean, half = mean_interval(v, level)
    if len(v) < 2 or mean == 0.0:
        return Estimate(mean, mean, mean, len(v))
    spread = math.exp(min(half / mean, 700.0))
    return Estimate(mean, mean / spread, mean * spread, len(v))


RATIO, DIFFERENCE = "ratio", "difference"


@dataclass(frozen=True)
class Change:
    """A contender against the baseline over ``n`` paired units: a ratio (1.0 = no change) or a difference
    (0.0 = no change), with its interval (None for one unit: nothing to test)."""

    kind: str
    value: float
    low: float | None
    high: float | None
    n: int

    @property
    def neutral(self) -> float:
        return 1.0 if self.kind == RATIO else 0.0

    @property
    def significant(self) -> bool:
        return self.low is not None and (self.low > self.neutral or self.high < self.neutral)

    def better(self, lower_is_better: bool) -> bool | None:
        """True for a significant improvement, False for a significant regression, None for neither."""
        if not self.significant:
            return None
        return (self.value < self.neutral) == lower_is_better

    def as_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "value": self.value,
            "low": self.low,
            "high": self.high,
            "n": self.n,
            "significant": self.significant,
        }


def paired_change(values: Sequence[float], baseline: Sequence[float], level: float = LEVEL) -> Change:
    """``values`` against ``baseline``, unit by unit (the same units in the same order)."""
    v, b = np.asarray(values, dtype=float), np.asarray(baseline, dtype=float)
    if len(v) != len(b) or not len(v):
        raise ValueError(f"a paired change needs the same units on both sides, got {len(v)} and {len(b)}")
    if not (np.all(np.isfinite(v)) and np.all(np.isfinite(b))):
        raise ValueError("a paired change needs finite values")
    if np.all(v > 0) and np.all(b > 0):
        kind, d = RATIO, np.log(v / b)
    else:
        kind, d = DIFFERENCE, v - b
    mean, half = mean_interval(d, level)
    if len(d) < 2:
        low = high = None
    else:
        low, high = mean - half, mean + half
    if kind == RATIO:
        exp = lambda x: None if x is None else math.exp(min(x, 700.0))  # noqa: E731
        return Change(RATIO, exp(mean), exp(low), exp(high), len(d))
    return Change(DIFFERENCE, mean, low, high, len(d))


def rank_ranges(
    samples: Mapping[str, Sequence[float] | None], lower_is_better: bool = True, level: float = LEVEL
) -> dict[str, tuple[int, int]]:
    """Each contender's (best, worst) possible rank, 1 the best, from every pairwise paired comparison of
    its per-unit values; a contender without values (None) ranks after all the others, unresolved among them."""
    known = [name for name, values in samples.items() if values is not None]
    ranges: dict[str, tuple[int, int]] = {}
    for a in known:
        beaten_by = beats = 0
        for b in known:
            if a != b:
                verdict = paired_change(samples[a], samples[b], level).better(lower_is_better)
                beats += verdict is True
                beaten_by += verdict is False
        ranges[a] = (1 + beaten_by, len(known) - beats)
    for name in samples:
        ranges.setdefault(name, (len(known) + 1, len(samples)))
    return ranges


def rank_text(best: int, worst: int) -> str:
    """``3`` for a resolved rank, ``2–5`` for one the data cannot place more closely."""
    return str(best) if best == worst else f"{best}–{worst}"
