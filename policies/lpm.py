"""``lpm``: longest-prefix-match first (SGLang's cache-aware ordering), so that prefix caching pays off."""

from __future__ import annotations

from kvsched.policies.continuous import ContinuousBatching


class Lpm(ContinuousBatching):
    """Longest prefix match first: admit the waiting groups whose prompts are most cached, FCFS among equals.

    Ordering needs a prefix-cache lookup per waiting group, so, as SGLang does, the policy falls
    back to FCFS when more than ``max_queue`` groups wait (SGLang: 128) or when prefix caching is
    off. Requests that share a cached system prompt are then admitted while their prefix is
    still resident, instead of after it was evicted. No starvation claim: a request with no
    cached prefix can be overtaken for as long as matching requests keep arriving.
    """

    name = "lpm"

    def __init__(self, max_queue: int = 128) -> None:
        self.max_queue = max_queue

    def order_waiting(self, step):
        waiting = step.waiting
        if not step.cache.enable_prefix_caching or len(waiting) > self.max_queue:
            return waiting
        matched = {g.request_id: step.cache.num_cached_tokens(g) for g in waiting}
        return sorted(waiting, key=lambda g: (-matched[g.request_id], g.arrival_time))
