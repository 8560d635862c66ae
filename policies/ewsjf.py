"""``ewsjf``: EWSJF's prompt-length queues and their weighted score (vLLM PR #33392, arXiv 2601.21758)."""

from __future__ import annotations

from itertools import chain

from kvsched.policies.proposals import waited
from kvsched.policies.vllm_v1 import VllmV1


class Ewsjf(VllmV1):
    """vLLM V1 with waiting requests grouped into prompt-length queues, the queues served by score.

    Requests fall into queues by prompt length (``edges``: the upper bounds of all queues but the
    last), FCFS inside each. Each step the queues are offered in decreasing score,
    ``urgency_weight * oldest wait / wait_scale_s + fairness_weight * time since the queue was
    last offered first / wait_scale_s + sjf_weight * sjf_tokens / mean prompt length``: short queues
    lead, a queue that waited or was passed over catches up. The PR's Refine-and-Prune re-partitioning
    and its Bayesian tuning of the weights are not modelled: the edges and weights are fixed options.
    """

    name = "ewsjf"
    claims = frozenset({"starvation-free"})

    def __init__(
        self,
        edges: str | tuple[int, ...] = (256, 1024, 4096),
        urgency_weight: float = 1.0,
        fairness_weight: float = 0.5,
        sjf_weight: float = 1.0,
        wait_scale_s: float = 5.0,
        sjf_tokens: float = 256.0,
        **v1,
    ) -> None:
        super().__init__(**v1)
        if isinstance(edges, str):
            edges = tuple(int(e) for e in edges.split(",") if e.strip())
        self.edges = tuple(sorted(edges))
        self.weights = (urgency_weight, fairness_weight, sjf_weight)
        self.wait_scale_s, self.sjf_tokens = wait_scale_s, sjf_tokens
        if min(self.weights) < 0 or self.weights[0] <= 0 or self.wait_scale_s <= 0 or self.sjf_tokens <= 0:
            raise ValueError("weights must be >= 0 (urgency_weight > 0), wait_scale_s and sjf_tokens > 0")
        self.last_first: dict[int, float] = {}  # queue -> when it was last offered first

    def queue_of(self, group) -> int:
        return sum(group.prompt_len > e for e in self.edges)

    def score(self, step, queue: int, members) -> float:
        urgency, fairness, sjf = self.weights
        passed_over = step.now - self.last_first.get(queue, members[0].arrival_time)
        mean_len = sum(g.prompt_len for g in members) / len(members)
        return (
            urgency * waited(step, members[0]) + fairness * passed_over
        ) / self.wait_scale_s + sjf * self.sjf_tokens / mean_len

    def order_waiting(self, step):
        queues: dict[int, list] = {}
        for group in step.waiting:
            queues.setdefault(self.queue_of(group), []).append(group)
        ranked = sorted(queues, key=lambda q: (-self.score(step, q, queues[q]), q))
        if ranked:
            self.last_first[ranked[0]] = step.now
        return chain.from_iterable(queues[q] for q in ranked)
