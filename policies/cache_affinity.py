"""``cache-affinity``: the most-cached of the first ``window_k`` waiting requests first (vLLM RFC #42185)."""

from __future__ import annotations

from kvsched.policies.proposals import WindowedV1, windowed


class CacheAffinity(WindowedV1):
    """vLLM V1 with the first ``window_k`` waiting requests sorted by cached prefix length, longest first.

    The RFC's ``CacheAffinityScheduler``: requests whose prompt prefix is resident are admitted while it
    still is. Unlike ``lpm`` (which sorts the whole queue and falls back to FCFS past 128) the reorder
    never reaches past ``window_k`` (the RFC's last measured setting: 32). No starvation claim: a cold
    request at the head can be passed by every warm one that enters the window behind it.
    """

    name = "cache-affinity"
    claims: frozenset[str] = frozenset()

    def __init__(self, window_k: int = 32, **v1) -> None:
        super().__init__(window=window_k, **v1)

    def order_waiting(self, step):
        return windowed(step.waiting, self.window, lambda g: -step.cache.num_cached_tokens(g))
