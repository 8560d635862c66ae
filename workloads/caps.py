"""The ``max_tokens`` a client sends: a request's cap, kept apart from its true output length.

A workload knows how many tokens each request will really generate (``Request.output_len``: the
simulator needs it to end the request, as a model's end-of-sequence token would). vLLM's scheduler
knows only what the client sent, the cap, so a policy that reads ``max_tokens`` must not learn the
answer's length from it. Each workload therefore sends a cap drawn from a cap model (``cap`` in its
spec), never the output itself unless that is asked for:

- ``{"kind": "fixed"}``: every request the same cap, ``tokens`` (by default the longest output the
  workload can produce: a synthetic spec's output maximum, a trace's longest recorded answer, so no
  answer is cut and the cap says nothing about any one request), as a client that always sends
  ``max_tokens=N`` does (``vllm bench serve --random-output-len``, inference-perf's fixed output);
- ``{"kind": "drawn", "caps": {"256": 1, "1024": 2}}``: each request a cap drawn from the weights,
  independently of its answer, as a mix of clients with their own settings sends them;
- ``{"kind": "exact"}``: the cap is the answer's length (``vllm bench serve`` on ShareGPT sends the
  reference answer's length): a policy reading it knows the future. Only when asked for, and shown in
  the workload's description, as every cap model is.

An answer longer than its cap is cut to it (it ends by length, as a server would end it).
"""

from __future__ import annotations

import random
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kvsched.core.request import MAX_TOKENS


class _Cap(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class FixedCap(_Cap):
    kind: Literal["fixed"] = "fixed"
    tokens: int | None = Field(None, ge=1, le=MAX_TOKENS, description="the cap; default: the longest output")


class DrawnCap(_Cap):
    kind: Literal["drawn"] = "drawn"
    caps: dict[Annotated[int, Field(ge=1, le=MAX_TOKENS)], float] = Field(description="weights of each cap")

    @field_validator("caps")
    @classmethod
    def _weights(cls, table: dict) -> dict:
        from kvsched.workloads.synthetic import check_weights

        return check_weights(table)


class ExactCap(_Cap):
    kind: Literal["exact"] = "exact"


CapModel = Annotated[FixedCap | DrawnCap | ExactCap, Field(discriminator="kind")]


class Capper:
    """A cap model applied to one workload's requests, in order: ``capper(output) -> (cap, output)``.

    ``longest`` is the longest output the workload can produce (the default fixed cap); a drawn cap uses
    its own random stream (from ``seed``), so the workload's other draws are the same whatever the cap model."""

    def __init__(self, model: FixedCap | DrawnCap | ExactCap, longest: int, seed: int = 0) -> None:
        self.model = model
        self.fixed = (model.tokens or longest) if isinstance(model, FixedCap) else None
        if isinstance(model, DrawnCap):
            from kvsched.workloads.synthetic import Mix

            self.mix, self.rng = Mix(model.caps), random.Random(f"caps:{seed}")

    def __call__(self, output: int) -> tuple[int, int]:
        if isinstance(self.model, ExactCap):
            return output, output
        cap = self.fixed if self.fixed is not None else self.mix.pick(self.rng)
        return cap, min(output, cap)
