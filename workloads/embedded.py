"""Synthetic workloads: Poisson arrivals, log-normal prompt and output lengths, a share of n > 1."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator

from pydantic import BaseModel, ConfigDict, Field

from kvsched.core.request import Request, SamplingParams
from kvsched.workloads.arrivals import Rate
from kvsched.workloads.errors import MAX_REQUESTS


class SyntheticWorkload(BaseModel):
    """A reproducible stream of requests; the same fields and seed give the same requests.

    The defaults are the embedded main job: a chat-like mix (prompts around 400 tokens, answers
    around 180) arriving in bursts that fill the 7,319-block KV cache vLLM leaves a Llama-2-7B on
    an A100-80GB (the default profile), so that requests are preempted and the n > 1 share is
    swapped, while the queue still drains between bursts.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    num_requests: int = Field(400, ge=1, le=MAX_REQUESTS)
    rate: Rate = 16.0
    prompt_median: int = Field(400, ge=1)
    prompt_sigma: float = Field(0.8, ge=0)
    prompt_max: int = Field(1536, ge=1)
    output_median: int = Field(180, ge=1)
    output_sigma: float = Field(0.7, ge=0)
    output_max: int = Field(480, ge=1)
    multi_share: float = Field(0.15, ge=0, le=1, description="share of requests with n > 1")
    max_n: int = Field(4, ge=2)
    seed: int = 0

    def requests(self) -> list[Request]:
        return list(self.iter_requests())

    def iter_requests(self) -> Iterator[Request]:
        """The requests in arrival order, made one at a time."""
        rng = random.Random(self.seed)
        t = 0.0
        params: dict[int, SamplingParams] = {}
        for i in range(self.num_requests):
            t += rng.expovariate(self.rate)
            prompt = _lognormal(rng, self.prompt_median, self.prompt_sigma, self.prompt_max)
            output = _lognormal(rng, self.output_median, self.output_sigma, self.output_max)
            n = rng.randint(2, self.max_n) if rng.random() < self.multi_share else 1
            sp = params.get(n)
            if sp is None:  # one shared (frozen) object per n, not one per request
                sp = params[n] = SamplingParams(n=n, max_tokens=self.output_max)
            yield Request(
                request_id=f"req-{i}", prompt_len=prompt, arrival_time=round(t, 6), output_len=output, sampling=sp
            )


def _lognormal(rng: random.Random, median: int, sigma: float, cap: int) -> int:
    return max(1, min(cap, round(rng.lognormvariate(math.log(median), sigma))))
