"""Length distributions for synthetic workloads: fixed, uniform, log-normal, empirical.

Each is a small pydantic model with a ``kind`` tag so that a workload spec (JSON) can name it,
and a ``sample(rng)`` that draws one positive integer.
"""

from __future__ import annotations

import math
import random
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kvsched.core.request import MAX_TOKENS  # a length is a request's tokens: at most 2**31


class _Dist(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Fixed(_Dist):
    kind: Literal["fixed"] = "fixed"
    value: int = Field(ge=1, le=MAX_TOKENS)

    def sample(self, rng: random.Random) -> int:
        return self.value

    @property
    def most(self) -> int:
        """The largest length a draw can give (what a workload's size is bounded by before it is made)."""
        return self.value

    @property
    def mean(self) -> float:
        return float(self.value)

    @property
    def upper(self) -> int:
        """The largest length it draws."""
        return self.value


class Uniform(_Dist):
    """Integers in ``[low, high]``, both included."""

    kind: Literal["uniform"] = "uniform"
    low: int = Field(ge=1, le=MAX_TOKENS)
    high: int = Field(ge=1, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _order(self) -> Uniform:
        if self.high < self.low:
            raise ValueError(f"uniform high ({self.high}) < low ({self.low})")
        return self

    def sample(self, rng: random.Random) -> int:
        return rng.randint(self.low, self.high)

    @property
    def most(self) -> int:
        return self.high

    @property
    def mean(self) -> float:
        return (self.low + self.high) / 2

    @property
    def upper(self) -> int:
        return self.high


class LogNormal(_Dist):
    """Log-normal with the given median and log-space sigma, rounded and clipped to ``[1, max]``."""

    kind: Literal["lognormal"] = "lognormal"
    median: float = Field(gt=0, le=MAX_TOKENS)
    sigma: float = Field(ge=0, le=10)  # exp() of a draw then stays far from overflowing
    max: int = Field(1 << 20, ge=1, le=MAX_TOKENS)

    def sample(self, rng: random.Random) -> int:
        return max(1, min(self.max, round(rng.lognormvariate(math.log(self.median), self.sigma))))

    @property
    def most(self) -> int:
        return self.max

    @property
    def mean(self) -> float:
        return min(float(self.max), self.median * math.exp(self.sigma**2 / 2))

    @property
    def upper(self) -> int:
        return self.max


class Empirical(_Dist):
    """Draws uniformly from observed values (e.g. a column of a trace)."""

    kind: Literal["empirical"] = "empirical"
    values: tuple[Annotated[int, Field(le=MAX_TOKENS)], ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _positive(self) -> Empirical:
        if min(self.values) < 1:
            raise ValueError("empirical lengths must all be >= 1")
        return self

    def sample(self, rng: random.Random) -> int:
        return self.values[int(rng.random() * len(self.values))]

    @property
    def most(self) -> int:
        return max(self.values)

    @property
    def mean(self) -> float:
        return sum(self.values) / len(self.values)

    @property
    def upper(self) -> int:
        return max(self.values)


LengthDist = Annotated[Fixed | Uniform | LogNormal | Empirical, Field(discriminator="kind")]
