"""``hrrn``: highest response ratio next, SGLang's policy (sgl-project/sglang PR #32911), on vLLM V1."""

from __future__ import annotations

from kvsched.policies.proposals import WindowedV1, uncached_tokens, waited, windowed


class Hrrn(WindowedV1):
    """vLLM V1 with waiting requests in decreasing response ratio, (wait + service) / service.

    Service is estimated, as SGLang does, from the uncached prompt length: ``uncached tokens /
    prefill_tokens_per_s`` seconds. Short prompts go first, like SJF, but a request's ratio grows
    with its wait without bound, so a long one is not passed forever.
    """

    name = "hrrn"
    claims = frozenset({"starvation-free"})

    def __init__(self, prefill_tokens_per_s: float = 10_000.0, window: int = 128, **v1) -> None:
        super().__init__(window=window, **v1)
        self.tokens_per_s = prefill_tokens_per_s
        if prefill_tokens_per_s <= 0:
            raise ValueError(f"prefill_tokens_per_s must be > 0, got {prefill_tokens_per_s}")

    def order_waiting(self, step):
        return windowed(step.waiting, self.window, lambda g: self.ratio(step, g))

    def ratio(self, step, group):
        """The response ratio, highest first (negated), the shorter service first among equals."""
        service = max(uncached_tokens(step, group), 1) / self.tokens_per_s
        return (-(waited(step, group) + service) / service, service, group.arrival_time)
