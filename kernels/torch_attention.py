"""Paged attention in vectorised torch: the CPU backend (and a GPU fallback without Triton).

Decode rows (one query token per sequence) are batched into one gather and one grouped matmul;
each sequence with several query tokens (a prompt, a prefill chunk, a recompute) runs as one
dense causal attention over its own gathered K/V, so memory stays proportional to the work.
"""

from __future__ import annotations

import torch


def _gather(cache: torch.Tensor, table: torch.Tensor, length: int) -> torch.Tensor:
    """K or V of one sequence's first ``length`` positions: ``[length, KVH, D]``."""
    block_size = cache.shape[1]
    blocks = table[: -(-length // block_size)]
    return cache[blocks].flatten(0, 1)[:length]


def paged_attention_torch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Same contract as ``kernels.reference.paged_attention_loop``; computes in fp32."""
    num_tokens, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    cu, lens = cu_seqlens_q.tolist(), seq_lens.tolist()
    tables = block_tables.to(device=k_cache.device, dtype=torch.long)
    q_lens = [cu[i + 1] - cu[i] for i in range(len(lens))]

    decode = [i for i, n in enumerate(q_lens) if n == 1]
    if decode:
        rows = torch.tensor([cu[i] for i in decode], device=q.device)
        dlens = torch.tensor([lens[i] for i in decode], device=q.device)
        width = max(lens[i] for i in decode)
        nblocks = -(-width // block_size)
        idx = tables[decode][:, :nblocks]  # [B, nblocks]
        keys = k_cache[idx].flatten(1, 2)[:, :width].float()  # [B, S, KVH, D]
        values = v_cache[idx].flatten(1, 2)[:, :width].float()
        qd = q[rows].float().view(len(decode), num_kv_heads, group, head_dim)
        scores = torch.einsum("bkgd,bskd->bkgs", qd, keys) * scale
        valid = torch.arange(width, device=q.device)[None, :] < dlens[:, None]  # [B, S]
        scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        o = torch.einsum("bkgs,bskd->bkgd", probs, values)
        out[rows] = o.reshape(len(decode), num_heads, head_dim).to(q.dtype)

    for i, n in enumerate(q_lens):
        if n <= 1:
            continue
        seq_len = lens[i]
        keys = _gather(k_cache, tables[i], seq_len).float()  # [S, KVH, D]
        values = _gather(v_cache, tables[i], seq_len).float()
        qs = q[cu[i] : cu[i + 1]].float().view(n, num_kv_heads, group, head_dim)
        scores = torch.einsum("tkgd,skd->kgts", qs, keys) * scale
        positions = torch.arange(seq_len - n, seq_len, device=q.device)
        causal = torch.arange(seq_len, device=q.device)[None, :] <= positions[:, None]  # [n, S]
        scores = scores.masked_fill(~causal, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        o = torch.einsum("kgts,skd->tkgd", probs, values)
        out[cu[i] : cu[i + 1]] = o.reshape(n, num_heads, head_dim).to(q.dtype)
    return out
