"""``session-affinity``: bounded promotion of a warm session's next turn (vLLM PR #51384)."""

from __future__ import annotations

from itertools import chain

from kvsched.core.hookspecs import hookimpl
from kvsched.policies.proposals import recovering, waited
from kvsched.policies.vllm_v1 import VllmV1


class SessionAffinity(VllmV1):
    """vLLM V1 (FCFS), except that at most one cache-warm continuation of a recently active session is promoted.

    Among the first ``window`` waiting requests, the first whose ``session_id`` had a request finish
    less than ``session_ttl_s`` ago and whose prompt has at least ``min_cached_blocks`` blocks in the
    prefix cache moves to the front, so the next turn of a conversation runs while its history is
    resident. The promotion never passes a preempted request (the search stops at one), and none
    happens once the FCFS head has waited more than ``max_head_wait_s``: the head's delay is bounded.
    """

    name = "session-affinity"
    claims = frozenset({"starvation-free"})

    def __init__(
        self,
        window: int = 8,
        min_cached_blocks: int = 1,
        max_head_wait_s: float = 2.0,
        session_ttl_s: float = 30.0,
        **v1,
    ) -> None:
        super().__init__(**v1)
        self.window, self.min_cached_blocks = window, min_cached_blocks
        self.max_head_wait_s, self.session_ttl_s = max_head_wait_s, session_ttl_s
        if window < 1 or min_cached_blocks < 1 or max_head_wait_s < 0 or session_ttl_s <= 0:
            raise ValueError("window and min_cached_blocks must be >= 1, max_head_wait_s >= 0, session_ttl_s > 0")
        self.last_finished: dict[str, float] = {}  # session -> when its last request finished

    def warm(self, step, group) -> bool:
        finished = self.last_finished.get(group.session_id) if group.session_id is not None else None
        return (
            finished is not None
            and step.now - finished < self.session_ttl_s
            and step.cache.num_cached_tokens(group) >= self.min_cached_blocks * step.cache.block_size
        )

    def order_waiting(self, step):
        waiting = step.waiting
        if not waiting or recovering(waiting[0]) or waited(step, waiting[0]) > self.max_head_wait_s:
            return waiting
        for i, group in enumerate(waiting[: self.window]):
            if recovering(group):
                break
            if i and self.warm(step, group):
                return chain((group,), waiting[:i], waiting[i + 1 :])
        return waiting

    @hookimpl
    def on_step(self, report):
        for group in report.finished:
            if group.session_id is not None:
                self.last_finished[group.session_id] = report.now
        horizon = report.now - self.session_ttl_s
        if len(self.last_finished) > 4096:  # forget expired sessions now and then, not every step
            self.last_finished = {s: t for s, t in self.last_finished.items() if t > horizon}
