"""Choosing next tokens from logits: greedy, temperature, top-k, top-p, per-request seeds, n samples.

A seeded request draws each token from a generator seeded by (request seed, sample ordinal,
output position), so its output does not depend on batching, preemption or what else runs.
"""

from __future__ import annotations

import torch

_MASK = 1 << 63


def filter_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Probabilities of one row after temperature, top-k and nucleus (top-p) filtering."""
    logits = logits.float() / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # mass strictly above each token
        sorted_probs = sorted_probs.masked_fill(before >= top_p, 0.0)  # the top token always survives
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        probs = probs / probs.sum()
    return probs


def draw_seed(seed: int, ordinal: int, position: int) -> int:
    return (seed * 1_000_003 + ordinal * 10_007 + position * 7 + 1) % _MASK


def sample_rows(logits: torch.Tensor, rows, generator: torch.Generator) -> list[list[int]]:
    """Tokens for each logits row; ``rows[i] = (params, ordinal, position, count)``.

    Greedy rows are one batched argmax. A seeded row draws sample ``j`` from a generator seeded by
    (seed, ordinal + j, position); an unseeded row draws from ``generator``.
    """
    logits = logits.float()
    greedy = logits.argmax(dim=-1).tolist()
    out: list[list[int]] = []
    for i, (params, ordinal, position, count) in enumerate(rows):
        if params.temperature == 0.0:
            out.append([greedy[i]] * count)
            continue
        probs = filter_logits(logits[i], params.temperature, params.top_k, params.top_p)
        tokens = []
        for j in range(count):
            gen = generator
            if params.seed is not None:
                gen = torch.Generator().manual_seed(draw_seed(params.seed, ordinal + j, position))
            tokens.append(int(torch.multinomial(probs, 1, generator=gen)))
        out.append(tokens)
    return out
