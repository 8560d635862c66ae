"""inference-perf 0.7's random draws, reproduced: its two length samplers and its two load timers.

Read from inference-perf 0.7.0 (kubernetes-sigs/inference-perf, Apache-2.0), not copied:

- ``sample(dist, count, rng)`` is ``utils/numeric/distribution.sample_from_distribution``, what the
  ``shared_prefix`` generator draws system-prompt, question and output lengths with: normal,
  skew-normal (Azzalini's two-normal construction), log-normal (moment-matched to mean and
  std_dev), uniform over ``[min, max + 1)``, Poisson or fixed, then clipped to ``[min, max]`` and
  rounded.
- ``generate(dist, count, rng)`` is ``generate_distribution``, what ``random`` and ``synthetic``
  draw ``total_count`` input and output lengths with: normal (its mean must lie in ``[min, max]``),
  log-normal shifted so that ``min`` maps to 0, uniform over ``[min, max)``, or fixed.
- ``constant_times`` is ``ConstantLoadTimer``: ``int(rate × duration)`` exponential gaps scaled to
  sum to exactly ``duration`` (so "constant" load is Poisson-like, conditioned on its count).
- ``poisson_times`` is ``PoissonLoadTimer``: each second a Poisson(rate) count of requests, spread
  over that second by a ``ConstantLoadTimer``, a second with none skipped.

Given the same ``numpy.random.Generator`` state, each returns what inference-perf's function does.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

Kind = Literal["normal", "skew_normal", "lognormal", "uniform", "poisson", "fixed"]


class Distribution(BaseModel):
    """inference-perf's ``Distribution``, with its defaults and checks."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    min: int = 10
    max: int = 1024
    mean: float = 512
    std_dev: float = 200
    total_count: int | None = Field(None, ge=1, le=10_000_000)
    type: Kind = "normal"
    variance: float | None = None
    skew: float = 0.0

    @model_validator(mode="after")
    def _check(self) -> Distribution:
        if self.variance is not None and self.std_dev > 0:
            raise ValueError("Specify either 'std_dev' or 'variance', not both.")
        if self.variance is not None:
            if self.variance < 0:
                raise ValueError("Variance cannot be negative.")
            self.std_dev = math.sqrt(self.variance)
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) cannot be greater than max ({self.max}).")
        if self.std_dev < 0:
            raise ValueError("std_dev cannot be negative.")
        return self

    @classmethod
    def fixed(cls, value: int) -> Distribution:
        """What inference-perf makes of a plain integer length: min = max = mean, no spread."""
        return cls(min=value, max=value, mean=float(value), std_dev=0.0)


def sample(dist: Distribution, count: int, rng: np.random.Generator) -> np.ndarray:
    """``sample_from_distribution``: ``count`` integer lengths."""
    if dist.type == "fixed":
        return np.full(count, int(dist.mean), dtype=int)
    if dist.type == "normal":
        values = rng.normal(loc=dist.mean, scale=dist.std_dev, size=count)
    elif dist.type == "skew_normal":
        delta = dist.skew / math.sqrt(1.0 + dist.skew**2)
        u0 = rng.standard_normal(count)
        u1 = delta * u0 + math.sqrt(1.0 - delta**2) * rng.standard_normal(count)
        values = dist.mean + dist.std_dev * np.where(u0 >= 0, u1, -u1)
    elif dist.type == "lognormal":
        if dist.mean <= 0:
            raise ValueError("Lognormal distribution requires mean > 0.")
        if dist.std_dev <= 0:
            values = np.full(count, dist.mean, dtype=np.float64)
        else:
            sigma_sq = math.log(1.0 + (dist.std_dev / dist.mean) ** 2)
            values = rng.lognormal(mean=math.log(dist.mean) - sigma_sq / 2.0, sigma=math.sqrt(sigma_sq), size=count)
    elif dist.type == "uniform":
        values = rng.uniform(low=dist.min, high=dist.max + 1, size=count)
    else:  # poisson
        values = rng.poisson(lam=dist.mean if dist.mean > 0 else 1.0, size=count).astype(np.float64)
    return _bounded(values, dist)


def generate(dist: Distribution, count: int, rng: np.random.Generator) -> np.ndarray:
    """``generate_distribution``: ``count`` integer lengths (the older sampler of ``random`` and ``synthetic``)."""
    if dist.type == "fixed":
        return np.full(count, int(dist.mean), dtype=int)
    if dist.type == "uniform":
        values = rng.uniform(low=dist.min, high=dist.max, size=count)
    elif dist.type == "lognormal":
        shifted = dist.mean - dist.min
        if shifted <= 0:
            shifted = 1.0
        sigma2 = np.log(1 + (dist.std_dev / shifted) ** 2)
        values = rng.lognormal(mean=np.log(shifted) - sigma2 / 2, sigma=np.sqrt(sigma2), size=count) + dist.min
    elif dist.type == "normal":
        if dist.mean < dist.min or dist.mean > dist.max:
            raise ValueError("Mean cannot be outside min and max range.")
        values = rng.normal(loc=dist.mean, scale=dist.std_dev, size=count)
    else:
        raise ValueError(
            f"Unknown dist_type {dist.type!r}. Supported types: 'normal', 'lognormal', 'uniform', 'fixed'."
        )
    return _bounded(values, dist)


def _bounded(values: np.ndarray, dist: Distribution) -> np.ndarray:
    """Both samplers' last step: clipped to ``[min, max]``, rounded to integers, clipped again."""
    return np.clip(np.round(np.clip(values, dist.min, dist.max)).astype(int), dist.min, dist.max)


def constant_times(rate: float, duration: float, rng: np.random.Generator, start: float = 0.0) -> np.ndarray:
    """``ConstantLoadTimer``: ``int(rate × duration)`` send times after ``start``, the last at ``start + duration``."""
    count = int(rate * duration)
    if count == 0:
        return np.empty(0)
    gaps = rng.exponential(1 / rate, count)
    return start + np.cumsum(gaps * (duration / np.sum(gaps)))


def poisson_times(rate: float, count: int, rng: np.random.Generator, start: float = 0.0) -> np.ndarray:
    """``PoissonLoadTimer``: the first ``count`` send times after ``start``."""
    times: list[float] = []
    second = start
    while len(times) < count:
        n = int(rng.poisson(rate))
        if n < 1:
            second += 1.0
            continue
        times.extend(constant_times(n, 1.0, rng, second)[: count - len(times)])
        second += 1.0  # the n gaps sum to the second: the next second starts where the last send was
    return np.asarray(times)
