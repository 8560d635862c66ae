"""The recompute tax (vLLM RFC #54644): compute thrown away by preemptions by recompute, and done again.

A preemption by recompute frees the victim's KV blocks and sets its computed tokens to zero, so when
it is admitted again its prompt and the tokens it had generated are prefilled once more, less what
the prefix cache still holds. Per request (``core.sequence.SequenceGroup`` counts them as it is
admitted and preempted; a request of ``n`` sequences adds them up; its record reads them, ``requests.request_row``):

- ``discarded_tokens``: the computed tokens its preemptions by recompute threw away (the RFC's
  "wasted tokens"; a swap throws nothing away);
- ``recomputed_tokens``: of the positions it had computed before a preemption, those it computed
  again (prefix-cache hits are not computed, so not counted, as vLLM PR #57698 counts them);
- ``computed_tokens``: every token it computed, first time or again (prefill chunks and decodes,
  cache hits excluded).

The run's tax is ``recomputed_tokens / computed_tokens``, summed over requests. ``discarded_share``
is what the tax would be if every discarded token were computed again (no prefix cache to find
them in): ``discarded / (first-time compute + discarded)``, the RFC's accounting.
"""

from __future__ import annotations

from typing import Any

from kvsched.metrics.requests import as_columns, exact_sum, numbers

FIELDS = ("recomputed_tokens", "discarded_tokens", "computed_tokens")


def recompute_summary(records: Any) -> dict[str, float | int | None]:
    """The run's totals, its tax, and what one preemption by recompute threw away on average."""
    records = as_columns(records)
    totals = {name: exact_sum(numbers(records, name)) for name in FIELDS}
    preemptions = exact_sum(numbers(records, "preemptions_recompute"))
    computed = totals["computed_tokens"]
    uncached = computed - totals["recomputed_tokens"] + totals["discarded_tokens"]
    return {
        **totals,
        "tax": totals["recomputed_tokens"] / computed if computed else 0.0,
        "discarded_share": totals["discarded_tokens"] / uncached if uncached else 0.0,
        "discarded_per_preemption": totals["discarded_tokens"] / preemptions if preemptions else None,
    }
