"""Cache-affinity routers: send a request where its prompt's prefix is (or was sent).

``prefix-affinity`` keeps its own table of what it sent where (llm-d's prefix-cache scorer used
alone); ``precise-prefix`` asks each replica's real prefix cache (llm-d's precise scorer, fed by KV
events); both route on the prefix only, which is what collapses under load. ``cache-aware`` is
SGLang's and vllm-router's rule: the prefix while the fleet is balanced, the least loaded once not.
"""

from __future__ import annotations

import random

from kvsched.core.request import MAX_INT64
from kvsched.routers import options
from kvsched.routers.hookspecs import hookimpl
from kvsched.routers.prefix_index import PrefixIndex, prefix_hashes
from kvsched.routers.view import Route


def _best(replicas, score, rng: random.Random):
    """The replicas of the highest score, one drawn at random among ties (llm-d's max-score picker)."""
    top = max(score(r) for r in replicas)
    tied = [r for r in replicas if score(r) == top]
    return (tied[0] if len(tied) == 1 else tied[rng.randrange(len(tied))]), top


class PrefixAffinity:
    """The replica the router sent the longest prefix of this prompt to (its own table), else at random.

    The table is an LRU of block hashes per replica (llm-d's prefix-cache scorer used alone); ties,
    and prompts it never saw, go at random."""

    name = "prefix-affinity"

    def __init__(self, block_size: int = 16, capacity: int = 31_250, seed: int = 0) -> None:
        self.block_size, self.rng = options.block_size(block_size), random.Random(options.seed(seed))
        self.index = PrefixIndex(options.capacity(capacity))

    @hookimpl
    def route_request(self, request, replicas):
        depth = self.index.matches(prefix_hashes(request.prompt_token_ids, self.block_size))
        best, blocks = _best(replicas, lambda r: depth.get(r.name, 0), self.rng)
        return Route(best, f"sent {blocks} blocks of this prefix before" if blocks else "no prefix seen: at random")

    @hookimpl
    def on_routed(self, request, replica):
        self.index.insert(replica.name, prefix_hashes(request.prompt_token_ids, self.block_size))


class PrecisePrefix:
    """The replica whose real GPU prefix cache holds the most of this prompt; ties at random."""

    name = "precise-prefix"

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(options.seed(seed))

    @hookimpl
    def route_request(self, request, replicas):
        best, tokens = _best(replicas, lambda r: r.cached_prefix_tokens(request), self.rng)
        return Route(best, f"{tokens} prompt tokens cached there" if tokens else "nothing cached anywhere: at random")


class CacheAware:
    """SGLang's and vllm-router's cache_aware: the longest prefix match, the least loaded when imbalanced.

    If the busiest replica has more than ``balance_abs_threshold`` requests in flight beyond the
    idlest and more than ``balance_rel_threshold`` times as many, the least loaded; else the longest
    prefix match in the router's table if it covers more than ``cache_threshold`` of the prompt,
    else the replica with the smallest table."""

    name = "cache-aware"

    def __init__(self, cache_threshold: float = 0.3, balance_abs_threshold: int = 64, balance_rel_threshold: float = 1.5,
                 block_size: int = 16, capacity: int = 31_250) -> None:
        self.cache_threshold = options.number("cache_threshold", cache_threshold, 0.0, 1.0)
        self.abs = options.integer("balance_abs_threshold", balance_abs_threshold, 0, MAX_INT64)
        self.rel = options.number("balance_rel_threshold", balance_rel_threshold, 0.0)
        self.block_size, self.index = options.block_size(block_size), PrefixIndex(options.capacity(capacity))

    @hookimpl
    def route_request(self, request, replicas):
        loads = [r.in_flight_requests for r in replicas]
        busiest, idlest = max(loads), min(loads)
        if busiest - idlest > self.abs and busiest > self.rel * idlest:
            best = replicas[loads.index(idlest)]
            return Route(best, f"imbalanced ({busiest} vs {idlest} in flight): least loaded")
        hashes = prefix_hashes(request.prompt_token_ids, self.block_size)
        depth = self.index.matches(hashes)
        if depth:
            best = max(replicas, key=lambda r: depth.get(r.name, 0))
            rate = depth.get(best.name, 0) * self.block_size / request.prompt_len
            if rate > self.cache_threshold:
                return Route(best, f"prefix match {rate:.0%} of the prompt")
        best = min(replicas, key=lambda r: self.index.size(r.name))
        return Route(best, f"prefix match below {self.cache_threshold:.0%}: smallest table ({self.index.size(best.name)} blocks)")

    @hookimpl
    def on_routed(self, request, replica):
        self.index.insert(replica.name, prefix_hashes(request.prompt_token_ids, self.block_size))
