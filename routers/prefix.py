"""Cache-affinity routers, each with the load guard of the router it reproduces.

``prefix-affinity`` is Ray Serve's ``PrefixCacheAffinityRouter`` (the longest prefix it sent while the
fleet is balanced, power of two choices once it is not); ``cache-aware`` is SGLang's ``cache_aware``
(the least loaded once the fleet is imbalanced by absolute and relative thresholds, else the longest
prefix match, else the smallest table); ``precise-prefix`` is NVIDIA Dynamo's KV router (the least
cost: prompt tokens still to compute there after its real cache, and the load already there, in
tokens). docs/routers.md gives each guard's source and the bound on load it keeps.

Where a published rule leaves a choice open (which of the replicas holding the longest match, which
of the smallest tables), the built-ins take the one with the fewest prompt tokens awaiting their
first token there, then the fewest requests in flight, then one at random: a fresh signal of what
delays a first token, where requests in flight (mostly decoding) are not one.
"""

from __future__ import annotations

import random

from kvsched.core.request import MAX_INT64
from kvsched.routers import options
from kvsched.routers.choice import lowest, softmax_draw, two_choices
from kvsched.routers.hookspecs import hookimpl
from kvsched.routers.prefix_index import PrefixIndex, prefix_hashes
from kvsched.routers.view import Route


def _loads(replicas) -> tuple[list[int], list[tuple[int, int]]]:
    """Each replica's requests in flight (what the guards compare), and its (prompt tokens awaiting a
    first token, requests in flight) (what settles an open choice)."""
    in_flight = [r.in_flight_requests for r in replicas]
    return in_flight, [(r.in_prefill_tokens, n) for r, n in zip(replicas, in_flight)]


class _Table:
    """A router-side table of the prefixes sent to each replica (``PrefixIndex``), and a prompt's block
    hashes, made once for a request's ``route_request`` and ``on_routed``."""

    def __init__(self, block_size: int, capacity: int) -> None:
        self.block_size, self.index = options.block_size(block_size), PrefixIndex(options.capacity(capacity))
        self._last: tuple[tuple[int, ...] | None, list[int]] = (None, [])

    def hashes(self, request) -> list[int]:
        tokens = request.prompt_token_ids
        if tokens is not self._last[0]:
            self._last = (tokens, prefix_hashes(tokens, self.block_size))
        return self._last[1]

    def choose(self, request, replicas, loads: list, rng: random.Random, enough) -> tuple[int, float, bool]:
        """The replicas whose table holds the longest prefix of the prompt if ``enough(share of the prompt it
        covers)``, else those whose table is smallest; of them the least loaded by ``loads``, ties at random.
        The replica, the share, and whether it was the prefix that chose."""
        matches = self.index.matches(self.hashes(request))  # every replica sent it, in this pool or another
        depth = [matches.get(r.name, 0) for r in replicas]
        most = max(depth)
        rate = most * self.block_size / request.prompt_len
        if most and enough(rate):
            return lowest(loads, rng, [i for i, d in enumerate(depth) if d == most]), rate, True
        sizes = [self.index.size(r.name) for r in replicas]
        smallest = min(sizes)
        return lowest(loads, rng, [i for i, n in enumerate(sizes) if n == smallest]), rate, False

    def insert(self, request, replica) -> None:
        self.index.insert(replica.name, self.hashes(request))


class PrefixAffinity:
    """Ray Serve's PrefixCacheAffinityRouter: the replicas sent the longest prefix while balanced, else two choices.

    Balanced: the busiest replica has at most ``imbalanced_threshold`` requests in flight beyond the idlest.
    Then the replicas its table shows were sent the longest prefix of the prompt if that covers at least
    ``match_rate_threshold`` of it, else those with the smallest table; the least loaded of them. Imbalanced:
    the less loaded of two replicas drawn at random (``seed``). The table is an LRU of block hashes per replica."""

    name = "prefix-affinity"

    def __init__(
        self,
        block_size: int = 16,
        capacity: int = 31_250,
        imbalanced_threshold: float = 2,
        match_rate_threshold: float = 0.1,
        seed: int = 0,
    ) -> None:
        self.table = _Table(block_size, capacity)
        self.imbalanced = options.number("imbalanced_threshold", imbalanced_threshold, 0.0)
        self.match_rate = options.number("match_rate_threshold", match_rate_threshold, 0.0, 1.0)
        self.rng = random.Random(options.seed(seed))

    @hookimpl
    def route_request(self, request, replicas):
        in_flight, loads = _loads(replicas)
        low, high = min(in_flight), max(in_flight)
        if high - low > self.imbalanced:
            i, a, b = two_choices(len(loads), loads.__getitem__, self.rng)
            return Route(
                replicas[i],
                f"imbalanced ({high} vs {low} in flight): the less loaded of {replicas[a].name} and {replicas[b].name}",
            )
        i, rate, by_prefix = self.table.choose(
            request, replicas, loads, self.rng, lambda share: share >= self.match_rate
        )
        if by_prefix:
            return Route(replicas[i], f"sent {rate:.0%} of this prompt before; {in_flight[i]} in flight")
        return Route(
            replicas[i],
            f"prefix match {rate:.0%}, below {self.match_rate:.0%}: a smallest table, {in_flight[i]} in flight",
        )

    @hookimpl
    def on_routed(self, request, replica):
        self.table.insert(request, replica)


class CacheAware:
    """SGLang's cache_aware: the least loaded when imbalanced, else the longest prefix match, else the smallest table.

    Imbalanced: the busiest replica has more than ``balance_abs_threshold`` requests in flight beyond the
    idlest and more than ``balance_rel_threshold`` times as many; then the one with the fewest in flight
    (then the fewest prompt tokens awaiting a first token, then at random, ``seed``). Else the replicas
    whose table holds the longest prefix of the prompt if it covers more than ``cache_threshold`` of it,
    or else those with the smallest table; the least loaded of them."""

    name = "cache-aware"

    def __init__(
        self,
        cache_threshold: float = 0.3,
        balance_abs_threshold: int = 2,
        balance_rel_threshold: float = 1.5,
        block_size: int = 16,
        capacity: int = 31_250,
        seed: int = 0,
    ) -> None:
        self.cache_threshold = options.number("cache_threshold", cache_threshold, 0.0, 1.0)
        self.abs = options.integer("balance_abs_threshold", balance_abs_threshold, 0, MAX_INT64)
        self.rel = options.number("balance_rel_threshold", balance_rel_threshold, 0.0)
        self.table = _Table(block_size, capacity)
        self.rng = random.Random(options.seed(seed))

    @hookimpl
    def route_request(self, request, replicas):
        in_flight, loads = _loads(replicas)
        low, high = min(in_flight), max(in_flight)
        if high - low > self.abs and high > self.rel * low:
            i = lowest([(n, tokens) for tokens, n in loads], self.rng)
            return Route(replicas[i], f"imbalanced ({high} vs {low} in flight): least loaded")
        i, rate, by_prefix = self.table.choose(
            request, replicas, loads, self.rng, lambda share: share > self.cache_threshold
        )
        if by_prefix:
            return Route(replicas[i], f"prefix match {rate:.0%} of the prompt; {in_flight[i]} in flight")
        return Route(
            replicas[i],
            f"prefix match below {self.cache_threshold:.0%}: a smallest table "
            f"({self.table.index.size(replicas[i].name)} blocks), {in_flight[i]} in flight",
        )

    @hookimpl
    def on_routed(self, request, replica):
        self.table.insert(request, replica)


class PrecisePrefix:
    """NVIDIA Dynamo's KV router: the least cost, prefill (after its real cache) × ``overlap_weight`` plus blocks held.

    In tokens: (1 + ``overlap_weight``) × the prompt tokens its cache lacks, plus ``overlap_weight`` × the
    prompt tokens there awaiting their first token, plus the prompt tokens in flight there. Ties at random,
    or drawn by softmax over the costs at ``temperature`` > 0. A cached block lowers a replica's cost by
    (1 + ``overlap_weight``) blocks of tokens, so a block every prompt shares never outweighs more load."""

    name = "precise-prefix"

    def __init__(self, overlap_weight: float = 1.0, temperature: float = 0.0, seed: int = 0) -> None:
        self.overlap_weight = options.number("overlap_weight", overlap_weight, 0.0, 1e6)
        self.temperature = options.number("temperature", temperature, 0.0, 1e6)
        self.rng = random.Random(options.seed(seed))

    @hookimpl
    def route_request(self, request, replicas):
        prompt, w = request.prompt_len, self.overlap_weight
        new = [prompt - r.cached_prefix_tokens(request) for r in replicas]
        load = [w * r.in_prefill_tokens + r.in_flight_tokens for r in replicas]
        costs = [(1 + w) * n + held for n, held in zip(new, load)]
        i = softmax_draw(costs, self.temperature, self.rng)
        return Route(replicas[i], f"cost {costs[i]:g}: {new[i]} prompt tokens to compute, load {load[i]:g}")
