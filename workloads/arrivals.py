"""Arrival processes: Poisson, or bursty gamma-distributed gaps with a given coefficient of variation.

A gamma renewal process with mean gap ``1/rate`` and CV ``cv`` has shape ``1/cv²``: ``cv = 1`` is
Poisson, ``cv > 1`` clusters arrivals into bursts with long lulls between them (what production
traces show), ``cv < 1`` spaces them more evenly.
"""

from __future__ import annotations

import random
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

# A request every 11.6 days to a billion a second: the arrival times of any workload stay finite.
MIN_RATE, MAX_RATE = 1e-6, 1e9
Rate = Annotated[float, Field(ge=MIN_RATE, le=MAX_RATE, description="mean arrivals per second")]


class Poisson(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    kind: Literal["poisson"] = "poisson"
    rate: Rate

    def gaps(self, rng: random.Random):
        rate = self.rate
        while True:
            yield rng.expovariate(rate)


class Gamma(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    kind: Literal["gamma"] = "gamma"
    rate: Rate
    cv: float = Field(
        gt=0,
        le=100,
        description="coefficient of variation of the gaps (1 = Poisson; at most 100, a gamma shape of 1e-4)",
    )

    def gaps(self, rng: random.Random):
        shape = 1.0 / (self.cv * self.cv)
        scale = 1.0 / (self.rate * shape)
        while True:
            yield rng.gammavariate(shape, scale)


ArrivalProcess = Annotated[Poisson | Gamma, Field(discriminator="kind")]


def make_arrivals(rate: float, kind: str = "poisson", cv: float = 1.0) -> Poisson | Gamma:
    """The CLI's ``--arrival`` / ``--rate`` / ``--cv`` as a process."""
    if kind == "poisson":
        return Poisson(rate=rate)
    if kind == "gamma":
        return Gamma(rate=rate, cv=cv)
    raise ValueError(f"unknown arrival process {kind!r}; use poisson or gamma")
