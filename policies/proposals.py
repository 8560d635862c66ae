"""What the vLLM proposals' policies share: V1's scheduler, their common request measures, a bounded reorder.

Each proposal changes one thing in vLLM V1's ``Scheduler`` (the order of the waiting queue, or
the preemption victim), so each policy here is ``vllm-v1`` with one method replaced. The
measures several of them read (how long a request has waited, how much of its prompt is not in
the prefix cache) are defined once, here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from itertools import chain

from kvsched.policies.vllm_v1 import VllmV1


def waited(step, group) -> float:
    """Seconds since the request arrived (what the proposals' aging terms count)."""
    return step.now - group.arrival_time


def uncached_tokens(step, group) -> int:
    """Prompt tokens the request would still have to compute: its tokens less its prefix-cache hit."""
    return max(group.num_tokens - step.cache.num_cached_tokens(group), 0)


def recovering(group) -> bool:
    """A request back in the waiting queue after a preemption (vLLM's recovery requests)."""
    return group.num_preemptions > 0


class WindowedV1(VllmV1, ABC):
    """``vllm-v1`` whose first ``window`` waiting requests are offered in the order of ``key`` (lowest
    first, FCFS among equals), the rest in queue order behind them.

    The window bounds what a step costs (``key`` may probe the prefix cache) and, as RFC #51608
    asks of its plugins, how far a rule can reach into the queue.
    """

    def __init__(self, window: int = 128, **v1) -> None:
        super().__init__(**v1)
        self.window = int(window)
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {window}")

    @abstractmethod
    def key(self, step, group):
        """The request's rank in the window: lower is offered first (each proposal defines its own)."""

    def order_waiting(self, step):
        waiting = step.waiting
        head = sorted(waiting[: self.window], key=lambda g: self.key(step, g))
        return chain(head, waiting[self.window :]) if len(waiting) > self.window else head
