"""``vllm-v1``: vLLM V1's scheduler (0.32 ``vllm/v1/core/sched/scheduler.py``), the second reference policy.

docs/vllm-v1.md maps each rule to the source it mirrors; tests/test_vllm_v1_differential.py checks
it step by step against vLLM's own scheduler.
"""

from __future__ import annotations

from kvsched.allocators.alloc_status import AllocStatus
from kvsched.core.decisions import Outcome, Preemption, PreemptionMode
from kvsched.core.hookspecs import hookimpl
from kvsched.mechanics.step_v1 import grammar_ready

POLICIES = ("fcfs", "priority")
RELEASES = ("0.30", "0.31", "0.32", "0.33", "0.34")  # the vLLM releases tests/test_vllm_v1_differential.py runs against


def release_key(release: str) -> tuple[int, int]:
    """``"0.33"`` (or ``"0.33.1"``, a version vLLM reports) as ``(0, 33)``: releases compare in order."""
    parts = str(release).split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
        raise ValueError(f"vllm_release must be a vLLM release like {RELEASES[-1]!r}, got {release!r}")
    return int(parts[0]), int(parts[1])


class VllmV1:
    """vLLM V1: running requests first under one token budget, then waiting ones; chunked prefill; recompute preemption.

    Each step, in V1's order:

    1. Every running request, in running order, gets its next tokens (one to decode, with its draft
       tokens under ``num_speculative_tokens``, or the next prefill chunk: at most
       ``long_prefill_token_threshold`` when more than one request is eligible (``vllm_release="0.30"``:
       always; from ``"0.34"`` only with chunked prefill), and what is left of the shared budget); short of
       blocks, the last running request is preempted by recompute (``policy="priority"``: the least urgent,
       latest arrival), until the request fits or is itself the victim, which ends this loop
       (``vllm_release="0.33"`` and later, under ``priority``: the loop goes on to the more urgent requests
       after the one that preempted itself, as vLLM 0.33's does).
    2. Only in a step that preempted nothing, waiting requests are admitted in queue order
       (``priority``: by priority, arrival, id; ``vllm_release="0.30"`` under ``fcfs``: structured-output
       requests not preempted yet first, from their own queue; from ``"0.34"``, with
       ``cache_aware_admission_window`` N under ``fcfs`` and prefix caching, once KV usage reaches
       ``cache_aware_admission_threshold``, the fresh requests among the first N trade places, the deepest
       cached prefix first, and keep that order: ``reorder_by_cached_prefix``), passing over
       structured-output requests whose grammar is not compiled yet, while budget and ``max_num_seqs``
       allow, each with a chunk of what is left of the budget (``enable_chunked_prefill=False``: the whole
       prompt, or admission stops), until one does not fit: admission needs blocks for the whole prompt
       (less prefix-cache hits) plus, once anything runs, the watermark.
    """

    name = "vllm-v1"
    claims = frozenset({"starvation-free"})
    # V1's mechanics, its default watermark and its prefix caching (on in vLLM V1 unless a model cannot use it)
    engine_defaults = {"vllm_engine": "v1", "watermark": 0.0, "enable_prefix_caching": True}
    chunked_prefill = True  # its budget is a chunk size, not a length limit (executors/settings.py)

    def __init__(
        self,
        policy: str = "fcfs",
        long_prefill_token_threshold: int = 0,
        vllm_release: str = "0.32",
        cache_aware_admission_window: int = 0,
        cache_aware_admission_threshold: float = 0.5,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        self.priority = policy == "priority"
        self.long_prefill_token_threshold = long_prefill_token_threshold
        if long_prefill_token_threshold < 0:
            raise ValueError(f"long_prefill_token_threshold must be >= 0, got {long_prefill_token_threshold}")
        self.vllm_release = vllm_release
        release = release_key(vllm_release)
        # vLLM 0.30 cuts a long prefill to the threshold even when it is the only request; 0.31 only among others
        self.threshold_alone = release < (0, 31)
        # vLLM 0.30 queues a request that arrives waiting for its grammar apart (skipped_waiting), served first under
        # fcfs
        self.grammar_queue_first = release < (0, 31) and not self.priority
        # vLLM 0.33: the least urgent running request, having preempted itself, freed its blocks for the ones after it
        self.past_self_preemption = release >= (0, 33) and self.priority
        # vLLM 0.34: no threshold cut without chunked prefill (a prompt runs whole or waits)
        self.threshold_needs_chunking = release >= (0, 34)
        self.cache_aware_window = cache_aware_admission_window
        self.cache_aware_threshold = cache_aware_admission_threshold
        if cache_aware_admission_window < 0 or not 0.0 <= cache_aware_admission_threshold <= 1.0:
            raise ValueError(
                "cache_aware_admission_window must be >= 0 and cache_aware_admission_threshold within "
                f"0..1, got {cache_aware_admission_window} and {cache_aware_admission_threshold}"
            )
        if self.cache_aware_window and release < (0, 34):
            raise ValueError(f"cache_aware_admission_window is vLLM 0.34's; vllm_release={vllm_release!r} has none")
        self._grammar_woken: set[str] = set()  # grammar requests V1 has looked at ready (status WAITING since)

    @staticmethod
    def _urgency(group) -> tuple:
        return group.priority, group.arrival_time, group.request_id

    @hookimpl
    def select_batch(self, step):
        running = step.running  # a view made once a step
        alone = len(running) + len(step.waiting) <= 1
        threshold = 0 if alone and not self.threshold_alone else self.long_prefill_token_threshold
        chunked = step.config.enable_chunked_prefill
        if self.threshold_needs_chunking and not chunked:
            threshold = 0
        for group in running:
            left = step.remaining_tokens
            if left <= 0:
                break
            if step.was_touched(group):  # preempted earlier in this step
                continue
            cap = left if threshold <= 0 else min(threshold, left)  # of its tokens and drafts
            if step.advance(group, max_tokens=cap) is Outcome.PREEMPTED:
                if self.past_self_preemption:
                    continue
                break
        if step.num_preempted:
            return True
        woken = self._grammar_woken
        if self.cache_aware_window and not self.priority and step.config.enable_prefix_caching:
            self.reorder_by_cached_prefix(step)
        for group in self.order_waiting(step):
            if step.remaining_tokens <= 0 or step.remaining_seqs <= 0:
                break
            if not grammar_ready(group, step.now):  # skipped, keeping its place (WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR)
                continue
            if group.grammar_ready_at is not None and self.cache_aware_window:
                woken.add(group.request_id)
            if (
                chunked and group.max_running_seqs == 1
            ):  # a group of several (v0 mechanics; V1 fans n > 1 out) runs whole
                chunk = step.remaining_tokens if threshold <= 0 else min(threshold, step.remaining_tokens)
            else:
                # the whole prompt, or a threshold's cut, as vLLM still makes it; BUDGET if it does not fit what is left
                chunk = threshold if threshold > 0 and group.max_running_seqs == 1 else None
            if step.admit(group, max_tokens=chunk) in (Outcome.LATER, Outcome.BUDGET):
                break
        return True

    def reorder_by_cached_prefix(self, step) -> None:
        """vLLM 0.34's cache-aware admission (``Scheduler._reorder_waiting_by_cached_prefix``): once KV usage (free and
        cached-free blocks against the pool) reaches the threshold, the plain fresh requests among the first
        ``window`` waiting trade places, the deepest cached prefix first, then queue order; the others (preempted,
        a grammar V1 has not seen ready) keep their places. The queue keeps the new order (``step.reorder_waiting``)."""
        cache, waiting = step.cache, step.waiting
        if len(waiting) < 2 or 1.0 - cache.num_free_gpu_blocks / cache.num_gpu_blocks < self.cache_aware_threshold:
            return
        head = list(waiting[: self.cache_aware_window])
        woken = self._grammar_woken
        slots = [
            i
            for i, g in enumerate(head)
            if not g.num_preemptions and (g.grammar_ready_at is None or g.request_id in woken)
        ]
        if len(slots) < 2:
            return
        cached = {i: cache.num_cached_tokens(head[i]) for i in slots}
        order = sorted(slots, key=lambda i: (-cached[i], i))
        if order == slots:
            return
        front = list(head)
        for slot, source in zip(slots, order):
            front[slot] = head[source]
        step.reorder_waiting(front)
        if len(woken) > 2 * len(waiting) + 64:  # admitted, finished or aborted ones: dropped now and then
            woken.intersection_update(g.request_id for g in waiting)

    def order_waiting(self, step):
        """The order waiting requests are offered in (V1's request queue): the skeleton's first half."""
        if self.priority:
            return sorted(step.waiting, key=self._urgency)
        if self.grammar_queue_first:  # until preempted: vLLM puts a preempted request back in its main queue
            first = [g for g in step.waiting if g.grammar_ready_at is not None and not g.num_preemptions]
            return first + [g for g in step.waiting if g not in first] if first else step.waiting
        return step.waiting

    @hookimpl
    def can_allocate(self, step, group):
        """V1's admission: the whole prompt's blocks (``scheduler_reserve_full_isl``) plus the
        watermark once a request runs; a prompt that cannot fit even an empty cache is ignored."""
        cache = step.cache
        full = cache.blocks_to_allocate(group)
        if full > cache.num_gpu_blocks:
            return AllocStatus.NEVER
        watermark = cache.watermark_blocks if (step.running or step.admitted) else 0
        return AllocStatus.OK if full + watermark <= cache.num_free_gpu_blocks else AllocStatus.LATER

    def pick_victim(self, step, candidates, requester):
        """The running request to preempt for ``requester`` among ``candidates`` (every running one not yet
        preempted, the requester and those scheduled earlier in the step included): the skeleton's second half.
        Under ``priority`` the least urgent (latest); None: the last running one not yet scheduled (V1's tail)."""
        return max(candidates, key=lambda g: (g.priority, g.arrival_time)) if self.priority else None

    @hookimpl
    def choose_preemption(self, step, requester):
        """``pick_victim``'s choice (else V1's tail, else the requester itself), by recompute: V1 has no swap,
        and under v0 mechanics a swapped group would never come back."""
        preempted = set(step.preempted)
        victim = self.pick_victim(step, [g for g in step.running if g not in preempted], requester)
        if victim is None:
            victim = step.newest_unscheduled(exclude=requester)  # the core's default victim
        return Preemption(victim if victim is not None else requester, PreemptionMode.RECOMPUTE)
