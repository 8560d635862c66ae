"""``residual-sjf``: waiting prefills by what is left to compute after the prefix cache (vLLM PR #51375)."""

from __future__ import annotations

from kvsched.policies.proposals import WindowedV1, recovering, uncached_tokens, waited, windowed


class ResidualSjf(WindowedV1):
    """vLLM V1 with waiting requests sorted by residual prefill cost: tokens less prefix-cache hits, in KV blocks.

    A long prompt whose prefix is cached is cheap, so it is not sorted behind short cold ones. Costs
    are counted in whole KV blocks, so requests of the same block count keep arrival order. Recovery
    requests (preempted, back in the queue) go first, and a request that waited more than
    ``max_wait_ms`` is promoted ahead of the sorted ones, stragglers in FCFS order.
    """

    name = "residual-sjf"
    claims = frozenset({"starvation-free"})

    def __init__(self, max_wait_ms: float = 10_000.0, window: int = 128, **v1) -> None:
        super().__init__(window=window, **v1)
        self.max_wait_s = max_wait_ms / 1000.0
        if max_wait_ms <= 0:
            raise ValueError(f"max_wait_ms must be > 0, got {max_wait_ms}")

    def order_waiting(self, step):
        return windowed(step.waiting, self.window, lambda g: self.rank(step, g))

    def rank(self, step, group):
        """Recovery requests, then those waited past ``max_wait_ms``, in arrival order; then by residual blocks."""
        if recovering(group):
            return (0, 0, group.arrival_time)
        if waited(step, group) > self.max_wait_s:
            return (1, 0, group.arrival_time)
        blocks = -(-uncached_tokens(step, group) // step.cache.block_size)
        return (2, blocks, group.arrival_time)
