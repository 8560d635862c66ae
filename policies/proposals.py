"""What the vLLM proposals' policies share: V1's scheduler, their common request measures, a bounded reorder.

Each proposal changes one thing in vLLM V1's ``Scheduler`` (the order of the waiting queue, or
the preemption victim), so each policy here is ``vllm-v1`` with one method replaced. The
measures several of them read (how long a request has waited, how much of its prompt is not in
the prefix cache) are defined once, here.
"""

from __future__ import annotations

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


def windowed(waiting, window: int, key):
    """The first ``window`` of ``waiting`` in the order of ``key`` (lowest first, FCFS among equals), the rest in
    queue order behind them: a bounded reorder, as RFC #51608 asks of its plugins (``key`` may probe the cache)."""
    head = sorted(waiting[:window], key=key)
    return chain(head, waiting[window:]) if len(waiting) > window else head


class WindowedV1(VllmV1):
    """``vllm-v1`` that reorders only the first ``window`` waiting requests (``windowed``): the bound on what a
    step costs and on how far a rule can reach into the queue, as each proposal's ``order_waiting`` uses it. The
    builtins' internal base, not an API: a policy of one's own subclasses ``VllmV1`` (docs/writing-a-policy.md)."""

    def __init__(self, window: int = 128, **v1) -> None:
        super().__init__(**v1)
        self.window = window
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
