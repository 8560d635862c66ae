"""vLLM RFC #51608's four extension points on kvsched's hooks: a policy written as QueueSort, Filter,
Score and Preemption-key functions runs here unchanged.

The RFC ("Extensible Scheduler Plugin Framework", PR #51601) keeps vLLM V1's scheduler as the core and
lets narrow plugins decide, each against a frozen ``SchedulingCycleState``:

- **QueueSort**: ``select_queue(waiting_head, skipped_head)`` says which queue's head is tried next
  (``WAITING`` or ``SKIPPED``), ``order_candidates(candidates, state)`` orders a bounded window;
- **Filter**: ``filter(request, state)`` allows a candidate (``None`` or ``True``) or rejects it
  (``Reject(reason)``) for this cycle;
- **Score**: ``(score(request, state), weight)`` pairs; a finite float, higher preferred, summed by weight;
- **Preemption**: ``preemption_key(request, running_position)``; among the running requests the core
  would accept as victims, the largest key is evicted.

Here the core is ``vllm-v1`` (kvsched's V1 scheduler), the requests are ``GroupView``s, and
``Rfc51608`` turns the functions into ``select_batch``'s waiting order and ``choose_preemption``'s
victim. The skipped queue holds the requests a Filter rejected in an earlier cycle (vLLM's
``skipped_waiting``), oldest first; ``create_request_queue`` has no counterpart: the queues are the
core's. A function that returns something else than the RFC allows raises, which the engine reports
as a ``PolicyError`` naming the policy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from kvsched.policies.vllm_v1 import VllmV1

WAITING, SKIPPED = "waiting", "skipped"


@dataclass(frozen=True)
class Reject:
    """A Filter's answer that keeps the request out of this cycle, and why."""

    reason: str


@dataclass(frozen=True)
class Candidate:
    request: Any  # a GroupView
    queue: str  # WAITING or SKIPPED
    queue_position: int
    waiting_time: float


@dataclass(frozen=True)
class SchedulingCycleState:
    """What every plugin call of one cycle sees; built once per step, before any decision."""

    now: float
    block_size: int
    token_budget: int
    num_running_requests: int
    candidates: tuple[Candidate, ...]
    encoder_budget: int = 0  # kvsched has no encoder inputs


def skipped_first(waiting_head, skipped_head) -> str:
    """The RFC's default QueueSort choice, as vLLM V1 does it: skipped requests go back to the front."""
    return SKIPPED if skipped_head is not None else WAITING


class Rfc51608(VllmV1):
    """A policy written to RFC #51608's extension points (class attributes, or constructor arguments)."""

    name = "rfc51608"
    select_queue = staticmethod(skipped_first)
    order_candidates: ClassVar[Any] = None  # (candidates, state) -> candidates; None: by total score
    filters: ClassVar[tuple] = ()
    scorers: ClassVar[tuple] = ()  # ((score, weight), ...)
    preemption_key: ClassVar[Any] = None  # (request, running_position) -> key; None: the position (V1's tail)
    window = 128

    def __init__(self, **plugins) -> None:
        v1 = {k: plugins.pop(k) for k in ("policy", "long_prefill_token_threshold") if k in plugins}
        super().__init__(**v1)
        for key, value in plugins.items():
            if key not in ("select_queue", "order_candidates", "filters", "scorers", "preemption_key", "window"):
                raise ValueError(f"unknown RFC #51608 extension point {key!r}")
            setattr(self, key, value)
        self.skipped: dict[str, None] = {}  # request ids a Filter rejected, oldest first
        self.rejections: dict[str, str] = {}  # this cycle's: request id -> reason

    def cycle_state(self, step, queue) -> SchedulingCycleState:
        position = {WAITING: 0, SKIPPED: 0}
        candidates = []
        for group in queue[: self.window]:
            where = SKIPPED if group.request_id in self.skipped else WAITING
            candidates.append(Candidate(group, where, position[where], step.now - group.arrival_time))
            position[where] += 1
        return SchedulingCycleState(
            step.now, step.cache.block_size, step.config.max_num_batched_tokens, len(step.running), tuple(candidates)
        )

    def score(self, candidate: Candidate, state: SchedulingCycleState) -> float:
        total = 0.0
        for fn, weight in self.scorers:
            value = fn(candidate.request, state)
            if type(value) not in (int, float) or not math.isfinite(value):
                raise ValueError(f"Score {getattr(fn, '__name__', fn)!r} returned {value!r}, not a finite number")
            total += weight * value
        return total

    def allowed(self, candidate: Candidate, state: SchedulingCycleState) -> bool:
        for fn in self.filters:
            verdict = fn(candidate.request, state)
            if isinstance(verdict, Reject):  # out of this cycle; in the skipped queue for the next ones
                self.rejections[candidate.request.request_id] = verdict.reason
                self.skipped.setdefault(candidate.request.request_id, None)
                return False
            if verdict not in (None, True):
                raise ValueError(
                    f"Filter {getattr(fn, '__name__', fn)!r} returned {verdict!r}: allow with None or True, or "
                    "Reject(reason)"
                )
        return True

    def order_waiting(self, step):
        waiting = step.waiting
        state = self.cycle_state(step, waiting)
        self.rejections = {}
        present = {c.request.request_id for c in state.candidates}
        self.skipped = {rid: None for rid in self.skipped if rid in present}  # admitted or gone: off the queue
        kept = [c for c in state.candidates if self.allowed(c, state)]
        if self.order_candidates is not None:
            ordered = list(self.order_candidates(kept, state))
        else:
            ordered = sorted(kept, key=lambda c: -self.score(c, state))
        queues = {
            WAITING: [c for c in ordered if c.queue == WAITING],
            SKIPPED: [c for c in ordered if c.queue == SKIPPED],
        }
        while queues[WAITING] or queues[SKIPPED]:
            heads = {q: (queues[q][0].request if queues[q] else None) for q in queues}
            which = self.select_queue(heads[WAITING], heads[SKIPPED])
            if which not in queues or not queues[which]:
                which = WAITING if queues[WAITING] else SKIPPED
            yield queues[which].pop(0).request
        yield from waiting[self.window :]

    def pick_victim(self, step, candidates, requester):
        """The largest Preemption key (by default the position: V1's tail) among the others; else the requester."""
        position = {g.request_id: i for i, g in enumerate(step.running)}
        key = self.preemption_key or (lambda request, position: position)
        others = [g for g in candidates if g is not requester]
        return max(others, key=lambda g: key(g, position[g.request_id]), default=requester)
