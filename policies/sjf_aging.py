"""``sjf-aging``: short prompts first with a time-weighted score against starvation (vLLM RFC #29406, PR #29366)."""

from __future__ import annotations

from kvsched.policies.proposals import WindowedV1, waited, windowed


class SjfAging(WindowedV1):
    """vLLM V1 with waiting requests in decreasing score, a short-prompt term plus a waiting-time term.

    ``score = length_weight / (1 + prompt_len / length_median) + time_weight * wait / time_median``:
    the first term is at most ``length_weight`` and favours short prompts; the second grows with the
    wait without bound, so every request eventually leads. It sorts by raw prompt length (the prefix
    cache is not consulted: that is ``residual-sjf``'s refinement).
    """

    name = "sjf-aging"
    claims = frozenset({"starvation-free"})

    def __init__(
        self,
        length_median: float = 2048.0,
        time_median: float = 5.0,
        length_weight: float = 0.5,
        time_weight: float = 0.5,
        window: int = 128,
        **v1,
    ) -> None:
        super().__init__(window=window, **v1)
        self.length_median, self.time_median = length_median, time_median
        self.length_weight, self.time_weight = length_weight, time_weight
        if min(length_median, time_median, time_weight) <= 0 or length_weight < 0:
            raise ValueError("length_median, time_median and time_weight must be > 0, length_weight >= 0")

    def score(self, step, group) -> float:
        short = self.length_weight / (1.0 + group.prompt_len / self.length_median)
        return short + self.time_weight * waited(step, group) / self.time_median

    def order_waiting(self, step):
        return windowed(step.waiting, self.window, lambda g: (-self.score(step, g), g.arrival_time))
