"""llm-d's endpoint picker as a router: a filter, then weighted scorers in [0, 1], summed, the highest total wins.

Defaults are llm-d's (and BLIS's "llm-d parity"): ``precise-prefix-cache:2, queue-depth:1,
kv-utilization:1``. A prefix scorer plus load scorers is the "prefix plus load" configuration that
does not collapse under load where a prefix scorer alone does. Two guards keep the prefix from
overruling the load: the prefix scores are the share of this prompt a replica holds (a block every
prompt shares is worth its share of the prompt, not a whole point, as min-max scaling made it), and
the Gateway API Inference Extension's least-queue filter scores only the replicas whose queue (the
prompt tokens sent there whose first token has not come back) is within 1/N of the range above the
shortest (docs/routers.md).
"""

from __future__ import annotations

import random

from kvsched.errors import quote
from kvsched.routers import options
from kvsched.routers.choice import draw
from kvsched.routers.hookspecs import hookimpl
from kvsched.routers.prefix_index import PrefixIndex, prefix_hashes
from kvsched.routers.view import Route


def _min_max(values: list[float], higher_is_better: bool) -> list[float]:
    """Each value scaled to [0, 1] across the replicas (1 for all when they are equal)."""
    lo, hi = min(values), max(values)
    if hi == lo:
        return [1.0] * len(values)
    return [(v - lo) / (hi - lo) if higher_is_better else (hi - v) / (hi - lo) for v in values]


def least_queue(queues: list[int]) -> list[int]:
    """The Gateway API Inference Extension's least-queue filter: the replicas whose queue is at most the
    shortest plus 1/N of the range (N replicas), so never longer than the fleet's mean."""
    low, high = min(queues), max(queues)
    return [i for i, q in enumerate(queues) if (q - low) * len(queues) <= high - low]


class Weighted:
    """llm-d's endpoint picker: the least-queue filter, then weighted scorers summed; the highest total wins.

    ``weights="precise-prefix-cache:2,queue-depth:1,kv-utilization:1"`` (the default); scorers
    precise-prefix-cache, prefix-affinity, queue-depth, kv-utilization, active-requests. Ties at random
    (``seed``); ``least_queue=False`` scores every replica."""

    name = "weighted"
    SCORERS = ("precise-prefix-cache", "prefix-affinity", "queue-depth", "kv-utilization", "active-requests")

    def __init__(
        self,
        weights: str = "precise-prefix-cache:2,queue-depth:1,kv-utilization:1",
        block_size: int = 16,
        capacity: int = 31_250,
        least_queue: bool = True,
        seed: int = 0,
    ) -> None:
        if type(weights) is not str:
            raise ValueError(f"weights must be a string such as 'queue-depth:1,kv-utilization:1', got {quote(weights)}")
        self.weights = {}
        for item in filter(None, (p.strip() for p in weights.split(","))):
            scorer, _, weight = (part.strip() for part in item.partition(":"))
            if scorer not in self.SCORERS:
                raise ValueError(f"unknown scorer {quote(scorer)}; scorers: {', '.join(self.SCORERS)}")
            if scorer in self.weights:
                raise ValueError(f"scorer {scorer} is weighted twice")
            try:
                value: object = float(weight or 1)
            except ValueError:
                value = weight  # not a number: refused, quoted, below
            self.weights[scorer] = options.number(f"the weight of {scorer}", value, 0.0)
        if not any(self.weights.values()):
            raise ValueError("weights names no scorer of a weight above 0")
        if type(least_queue) is not bool:
            raise ValueError(f"least_queue must be true or false, got {quote(least_queue)}")
        self.block_size, self.rng = options.block_size(block_size), random.Random(options.seed(seed))
        self.filter = least_queue
        capacity = options.capacity(capacity)
        self.index = PrefixIndex(capacity) if "prefix-affinity" in self.weights else None

    def _scores(self, scorer: str, request, replicas) -> list[float]:
        if scorer == "precise-prefix-cache":
            return [r.cached_prefix_tokens(request) / request.prompt_len for r in replicas]
        if scorer == "prefix-affinity":
            hashes = prefix_hashes(request.prompt_token_ids, self.block_size)
            depth = self.index.matches(hashes)
            return [depth.get(r.name, 0) / len(hashes) if hashes else 0.0 for r in replicas]
        if scorer == "queue-depth":
            return _min_max([r.num_waiting for r in replicas], False)
        if scorer == "kv-utilization":
            return [1.0 - r.kv_usage for r in replicas]
        return [1.0 / (1 + r.in_flight_requests) for r in replicas]

    @hookimpl
    def route_request(self, request, replicas):
        kept = least_queue([r.in_prefill_tokens for r in replicas]) if self.filter else range(len(replicas))
        candidates = [replicas[i] for i in kept]
        totals = [0.0] * len(candidates)
        parts = {}
        for scorer, weight in self.weights.items():
            scores = parts[scorer] = self._scores(scorer, request, candidates)
            totals = [t + weight * s for t, s in zip(totals, scores)]
        top = max(totals)
        i = draw([i for i, t in enumerate(totals) if t == top], self.rng)
        why = ", ".join(f"{s} {parts[s][i]:.2f}×{w:g}" for s, w in self.weights.items())
        dropped = len(replicas) - len(candidates)
        filtered = f"; {dropped} longer queues filtered" if dropped else ""
        return Route(candidates[i], f"score {top:.2f} ({why}){filtered}")

    @hookimpl
    def on_routed(self, request, replica):
        if self.index is not None:
            self.index.insert(replica.name, prefix_hashes(request.prompt_token_ids, self.block_size))
