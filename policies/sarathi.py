"""``sarathi``: Sarathi-Serve's stall-free batching with chunked prefill (Agrawal et al., OSDI'24)."""

from __future__ import annotations

from kvsched.core.decisions import Outcome
from kvsched.core.hookspecs import hookimpl
from kvsched.policies.continuous import STOP


def _is_prefilling(group) -> bool:
    return group.num_uncomputed_tokens > group.num_seqs


class Sarathi:
    """Stall-free batching: decodes first, then the partial prefills, then new prefills, chunked to a token budget.

    Every step carries at most ``token_budget`` tokens (default: the engine's
    ``max_num_batched_tokens``). Ongoing decodes are never paused for a prompt: they are
    scheduled first, then whatever budget is left continues the prefill of partially computed
    prompts, then admits new prompts FCFS, the last one cut to the remaining budget (a chunk).
    A small budget keeps the time between tokens low at some cost in prefill efficiency.
    """

    name = "sarathi"
    claims = frozenset({"starvation-free"})
    chunked_prefill = True  # its budget is a chunk size, not a length limit (executors/settings.py)

    def __init__(self, token_budget: int | None = None) -> None:
        self.token_budget = token_budget
        if self.token_budget is not None and self.token_budget < 1:
            raise ValueError(f"token_budget must be >= 1, got {token_budget}")

    def _left(self, step) -> int:
        budget = step.config.max_num_batched_tokens if self.token_budget is None else self.token_budget
        return min(budget - step.num_batched_tokens, step.remaining_tokens)

    @hookimpl
    def select_batch(self, step):
        step.advance_decodes(max_tokens=self._left(step))  # oldest first; those in a prefill wait for the loop below
        running = step.running
        for group in running:
            if step.was_touched(group) or not _is_prefilling(group):
                continue
            if self._left(step) < 1 or step.advance(group, max_tokens=self._left(step)) is Outcome.BUDGET:
                break
        if step.num_preempted:
            return True
        for group in step.swapped:
            left = self._left(step)
            if (
                left < 1
                or (group.num_seqs > 1 and group.num_uncomputed_tokens > left)
                or step.swap_in(group, max_tokens=left) in STOP
            ):
                break
        if any(not step.was_touched(g) for g in step.swapped):
            return True
        for group in step.waiting:
            left = self._left(step)
            if left < 1:
                break
            if group.num_seqs > 1 and group.num_uncomputed_tokens > left:
                # A forked group (recomputed after preemption) cannot be chunked: it is admitted whole,
                # alone in an otherwise empty step (the core ignores it if it can never fit the budget).
                if step.num_batched_tokens == 0:
                    step.admit(group)
                break
            if step.admit(group, max_tokens=left) in STOP:
                break
        return True
