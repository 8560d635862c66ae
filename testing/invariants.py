"""The universal invariants every policy must keep, by name (the rows of ``engine check``)."""

from __future__ import annotations

VALID_DECISIONS = "valid-decisions"
ALLOCATOR_CONSISTENT = "allocator-consistent"
BUDGETS_RESPECTED = "budgets-respected"
FINISHES_WITHIN_BOUND = "finishes-within-bound"
NO_LEAKED_BLOCKS = "no-leaked-blocks"

INVARIANTS = {
    VALID_DECISIONS: "every decision is valid: no PolicyError, no exception from the policy",
    ALLOCATOR_CONSISTENT: "free + used = total, ref counts >= 0 and equal to holders, statuses match queues",
    BUDGETS_RESPECTED: "each step stays within max_num_batched_tokens and max_num_seqs",
    FINISHES_WITHIN_BOUND: "once arrivals stop, every request finishes within a step bound (no stall)",
    NO_LEAKED_BLOCKS: "after every request has finished, every block is free again",
}


class InvariantViolation(AssertionError):
    """One named invariant or claim failed; the message says how."""

    def __init__(self, invariant: str, message: str) -> None:
        super().__init__(f"[{invariant}] {message}")
        self.invariant = invariant
        self.detail = message
