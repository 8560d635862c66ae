"""The oracle: paged attention written as plainly as possible, one query token and one head at a time.

Too slow for real use; every other backend is tested against it.
"""

from __future__ import annotations

import torch


def paged_attention_loop(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal attention of packed queries over paged K/V.

    ``q`` is ``[T, H, D]``: the new tokens of sequence ``i`` are rows ``cu_seqlens_q[i]:cu_seqlens_q[i+1]``
    and sit at the last positions of its ``seq_lens[i]`` tokens (whose K/V is already in the cache,
    new tokens included). Query head ``h`` reads KV head ``h // (H // KVH)`` (GQA/MQA).
    """
    num_heads = q.shape[1]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.zeros_like(q)
    cu, lens, tables = cu_seqlens_q.tolist(), seq_lens.tolist(), block_tables.tolist()
    for i, seq_len in enumerate(lens):
        start, stop = cu[i], cu[i + 1]
        context = seq_len - (stop - start)
        for t in range(start, stop):
            position = context + (t - start)  # this token sees positions 0..position
            blocks = [tables[i][p // block_size] for p in range(position + 1)]
            offsets = [p % block_size for p in range(position + 1)]
            for h in range(num_heads):
                kvh = h // group
                keys = torch.stack([k_cache[b, o, kvh] for b, o in zip(blocks, offsets)]).float()
                values = torch.stack([v_cache[b, o, kvh] for b, o in zip(blocks, offsets)]).float()
                weights = torch.softmax((keys @ q[t, h].float()) * scale, dim=0)
                out[t, h] = (weights @ values).to(q.dtype)
    return out
