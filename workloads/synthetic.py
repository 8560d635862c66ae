"""Configurable synthetic workloads: an arrival process, length distributions, and mixes.

Written as JSON (``engine run --workload spec.json``) or built in code. The mixes are weight
tables: ``{"0": 1, "1": 3}`` for priorities, ``{"free": 0.8, "paid": 0.2}`` for tenants,
``{"1": 0.85, "4": 0.15}`` for ``n``, ``{"interactive": 0.3, "batch": 0.7}`` for SLO classes (none by
default). Same spec, same seed, same requests.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections.abc import Iterator
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kvsched.core.request import Label, Priority, Request, SamplingParams
from kvsched.workloads.arrivals import ArrivalProcess, Poisson
from kvsched.workloads.caps import CapModel, Capper, FixedCap
from kvsched.workloads.distributions import LengthDist, LogNormal
from kvsched.workloads.errors import MAX_REQUESTS


class Mix:
    """Weighted choice over a small table, in one ``random()`` call."""

    def __init__(self, table: dict) -> None:
        self.keys = list(table)
        self.cum = list(itertools.accumulate(table.values()))

    def pick(self, rng: random.Random):
        if len(self.keys) == 1:
            return self.keys[0]
        return self.keys[bisect.bisect_right(self.cum, rng.random() * self.cum[-1])]


def check_weights(table: dict | None) -> dict | None:
    if table is None:  # an optional mix not given
        return None
    if not table:
        raise ValueError("a mix needs at least one entry")
    total = sum(table.values())
    if (
        any(w < 0 for w in table.values()) or not 0 < total < math.inf
    ):  # an infinite sum would draw past the table's end
        raise ValueError("mix weights must be >= 0 with a positive, finite sum")
    return table


class SyntheticSpec(BaseModel):
    """A synthetic workload: ``num_requests`` arrivals with sampled lengths, priority, tenant and ``n``."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    kind: Literal["synthetic"] = "synthetic"
    num_requests: int = Field(1000, ge=1, le=MAX_REQUESTS)
    arrivals: ArrivalProcess = Poisson(rate=4.0)
    prompt: LengthDist = LogNormal(median=400, sigma=0.8, max=1536)
    output: LengthDist = LogNormal(median=180, sigma=0.7, max=480)
    n: dict[Annotated[int, Field(ge=1, le=64)], float] = Field(
        default_factory=lambda: {1: 1.0}, description="weights of each n"
    )
    priorities: dict[Priority, float] = Field(default_factory=lambda: {0: 1.0})
    tenants: dict[Annotated[str, Field(min_length=1)], float] = Field(default_factory=lambda: {"default": 1.0})
    slo_classes: dict[Label, float] | None = Field(
        None, description="weights of each SLO class (sla-tiers' tiers); none: no class"
    )
    cap: CapModel = Field(
        FixedCap(), description="the max_tokens a client sends (workloads/caps.py); default: the longest output"
    )
    seed: int = 0

    _weights = field_validator("n", "priorities", "tenants", "slo_classes")(
        classmethod(lambda cls, v: check_weights(v))
    )

    def requests(self) -> list[Request]:
        return list(self.iter_requests())

    def iter_requests(self) -> Iterator[Request]:
        """The requests in arrival order, made one at a time (a million need not be held at once)."""
        rng = random.Random(self.seed)
        gaps = self.arrivals.gaps(rng)
        n_mix, prio_mix, tenant_mix = Mix(self.n), Mix(self.priorities), Mix(self.tenants)
        slo_mix = Mix(self.slo_classes or {None: 1.0})  # drawn from only when it has a choice: no class, same stream
        capper = Capper(self.cap, self.output.upper, self.seed)
        params: dict[tuple[int, int], SamplingParams] = {}
        t = 0.0
        for i in range(self.num_requests):
            t += next(gaps)
            prompt = self.prompt.sample(rng)
            cap, output = capper(self.output.sample(rng))
            n = n_mix.pick(rng)
            sp = params.get((n, cap))
            if sp is None:
                sp = params[(n, cap)] = SamplingParams(n=n, max_tokens=cap)
            yield Request(
                request_id=f"req-{i}",
                prompt_len=prompt,
                output_len=output,
                arrival_time=round(t, 6),
                sampling=sp,
                priority=prio_mix.pick(rng),
                tenant=tenant_mix.pick(rng),
                slo_class=slo_mix.pick(rng),
            )

    def tenant_names(self) -> set[str]:
        """The tenants its requests can have."""
        return {t for t, w in self.tenants.items() if w > 0}

    def describe(self) -> dict:
        return self.model_dump(mode="json")
