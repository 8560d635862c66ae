"""``fcfs``: plain first-come-first-served continuous batching, the baseline every other policy is measured against."""

from __future__ import annotations

from kvsched.policies.continuous import ContinuousBatching


class Fcfs(ContinuousBatching):
    """FCFS continuous batching: decode all, resume swapped, admit prompts in arrival order, no delay gate.

    Orca's iteration-level scheduling as vLLM's v1 engine does it by default: prompts join the
    running batch in the same step as the decodes; admission stops at the first prompt that
    does not fit (head-of-line), so nobody overtakes anybody and nobody starves. Short of blocks,
    the newest running group is preempted (the core's default victim).
    """

    name = "fcfs"
    claims = frozenset({"starvation-free"})
