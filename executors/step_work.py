"""What a step asks of attention, counted per request: the query-key pairs its chunks compute and the
KV tokens they read, with or without a sliding window.

A step's attention cost is not a function of its totals (P prefill tokens, K context tokens read):
a chunk of c tokens after a context of n computes ``c·n + c(c+1)/2`` query-key pairs, so the same
P costs more as one long chunk deep into a prompt than as several short ones, and a sliding
window of w caps what each query reads. ``attention_work`` counts it from the step's sequences
(``SchedulerOutput.chunks``: their computed tokens, as the executor sees them before the engine
applies the step). The roofline cost model (``executors/roofline.py``) charges all of it; the
linear profile charges the pairs without a window, which the step's features count with the same
walk and formula (``StepFeatures.prefill_pairs``), so both kinds see one step's attention alike.
"""

from __future__ import annotations

from typing import NamedTuple

from kvsched.core.outputs import SchedulerOutput, causal_pairs


class AttentionWork(NamedTuple):
    """A step's attention, per layer: prefill (chunks of two or more tokens) and decode parts."""

    prefill_pairs: int  # query-key pairs the chunks compute (causal)
    prefill_kv: int  # KV tokens the chunks read (context and their own)
    decode_kv: int  # KV tokens the one-token decodes read (context and their own)


def pairs(context: int, chunk: int, window: int | None = None) -> int:
    """Query-key pairs of ``chunk`` tokens after ``context``: query i (from 1) sees ``min(context + i, window)``."""
    if window is None or context + chunk <= window:
        return causal_pairs(context, chunk)
    if context >= window:
        return chunk * window
    inside = window - context  # queries still short of the window
    return causal_pairs(context, inside) + (chunk - inside) * window


def read(context: int, chunk: int, window: int | None = None) -> int:
    """KV tokens ``chunk`` tokens after ``context`` read: the context (its last ``window``) and their own."""
    return (context if window is None else min(context, window)) + chunk


def attention_work(output: SchedulerOutput, window: int | None = None) -> AttentionWork:
    """The step's attention work, from its scheduled groups; a step of one-token decodes only, and the decode
    lane's members (one token each, no window), from the output's totals (``kv_tokens_read`` counts each
    scheduled sequence's context)."""
    if window is None and not output.prefill_tokens:  # only one-token decodes (most steps): their totals say it all
        return AttentionWork(0, 0, output.kv_tokens_read + output.decode_seqs)
    prefill_pairs = prefill_kv = decode_kv = contexts = 0
    for context, chunk in output.chunks():
        contexts += context
        if chunk == 1:
            decode_kv += read(context, 1, window)
        else:
            prefill_pairs += pairs(context, chunk, window)
            prefill_kv += read(context, chunk, window)
    lane = output.lane_decodes
    if lane:  # the lane's members decode one token each; kv_tokens_read counts every context, theirs too
        decode_kv += output.kv_tokens_read - contexts + lane
    return AttentionWork(prefill_pairs, prefill_kv, decode_kv)
