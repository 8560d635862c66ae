"""A step in flight, in the mirror's terms: vLLM's async scheduling (``AsyncScheduler``) for kvsched's core.

Under async scheduling vLLM schedules step N+1 while step N runs, so at every ``schedule()`` one
step may still be unsampled. vLLM counts that step's tokens as computed and the tokens it will
sample as ``num_output_placeholders``. The mirror does the same with its own core: a dispatched
step is applied at once (``Mirror.dispatch``), each sampling sequence taking a ``PLACEHOLDER``
token, which ``Mirror.sampled`` replaces by the token vLLM sampled. So the policy decides step
N+1 on what vLLM's scheduler holds then: the same computed tokens, the same blocks, the same
requests running. Three of vLLM's rules read the placeholders, and the core's V1 step keeps them
when its mechanics count them (``Mechanics.in_flight``: ``V1_IN_FLIGHT`` below):

- a request whose in-flight step samples its last token (``max_tokens`` or ``max_model_len``) is
  not scheduled again (vLLM: ``num_computed_tokens + 2 - num_output_placeholders >= num_prompt_tokens
  + max_tokens``, and ``max_model_len - num_computed_tokens - 1`` tokens at most): the step
  passes over it (LATER), it keeps its blocks and stays a preemption candidate until vLLM ends it
  when the token arrives (the mirror's groups may take one placeholder past their limit for
  this: vLLM, not the placeholder, ends them);
- a block is named in the prefix cache only once its tokens are known: vLLM's ``allocate_slots``
  caches up to ``num_tokens`` (without placeholders) and names the rest when the tokens arrive
  (``cache_blocks(request, num_computed_tokens - num_output_placeholders)``), as ``Mirror.sampled``
  does;
- short of blocks, vLLM preempts the last running request (``running.pop()``), which may now be
  the one asking: requests before it may have been passed over (their last token in flight), so
  ``newest_unscheduled(exclude=requester)`` answers None when the requester is the newest
  untouched one, rather than an older request passed over.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from kvsched.mechanics.engines import V1

if TYPE_CHECKING:
    from kvsched.core.sequence import Sequence

PLACEHOLDER = -1  # a token the model has not sampled yet (no vocabulary has id -1)


def num_placeholders(seq: Sequence) -> int:
    """How many of ``seq``'s last tokens are still in flight (they are always its last ones)."""
    n, output = 0, seq.output
    while n < len(output) and output[-1 - n] == PLACEHOLDER:
        n += 1
    return n


# V1's mechanics with a step in flight: its steps built by the rules above, and the blocks a step fills named as
# it is built (known tokens only) and when its tokens arrive (``Mirror.sampled``).
V1_IN_FLIGHT = replace(V1, name="v1-in-flight", in_flight=num_placeholders)
