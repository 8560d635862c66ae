"""Confidence intervals over repeated runs (several workload seeds): the Student-t interval of the mean."""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np


@lru_cache(maxsize=64)
def t_critical(df: int, level: float = 0.95) -> float:
    """The two-sided critical value of Student's t with ``df`` degrees of freedom: P(|T| ≤ x) = ``level``.

    Integrated numerically from the density (no scipy): 12.706 for df = 1, 2.776 for 4, 1.96 as df grows."""
    x = np.linspace(0.0, 700.0 if df == 1 else 60.0, 2_000_001)
    density = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi) * (1 + x * x / df) ** (-(df + 1) / 2)
    mass = np.concatenate(([0.0], np.cumsum((density[1:] + density[:-1]) / 2 * np.diff(x))))  # P(0 ≤ T ≤ x)
    return float(np.interp(level / 2, mass, x))


def mean_interval(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """(mean, half-width of its ``level`` confidence interval); the half-width is 0 for a single value."""
    v = np.asarray(values, dtype=float)
    if len(v) < 2:
        return float(v.mean()), 0.0
    return float(v.mean()), t_critical(len(v) - 1, level) * float(v.std(ddof=1)) / math.sqrt(len(v))
