"""Paged attention in vectorised torch: the CPU backend (and a GPU fallback without Triton).

Decode rows (one query token per sequence) are batched: one gather of their blocks and one
``scaled_dot_product_attention`` call with a length mask. Each sequence with several query tokens
(a prompt, a prefill chunk, a recompute) runs as one causal attention over its own gathered K/V,
so memory stays proportional to the work. SDPA's fused CPU kernel handles GQA (``enable_gqa``)
without repeating K/V; on this machine it halved the decode attention time of an einsum version.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def paged_attention_torch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Same contract as ``kernels.reference.paged_attention_loop``."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    block_size = k_cache.shape[1]
    gqa = num_heads != k_cache.shape[2]
    out = torch.empty_like(q)
    cu, lens = cu_seqlens_q.tolist(), seq_lens.tolist()
    tables = block_tables.to(device=k_cache.device, dtype=torch.long)
    q_lens = [cu[i + 1] - cu[i] for i in range(len(lens))]

    decode = [i for i, n in enumerate(q_lens) if n == 1]
    if decode:
        rows = torch.tensor([cu[i] for i in decode], device=q.device)
        dlens = torch.tensor([lens[i] for i in decode], device=q.device)
        nblocks = -(-max(lens[i] for i in decode) // block_size)
        idx = tables[decode][:, :nblocks] if len(decode) < len(lens) else tables[:, :nblocks]
        keys = k_cache[idx].flatten(1, 2).transpose(1, 2)  # [B, KVH, S, D], a view of the gathered copy
        values = v_cache[idx].flatten(1, 2).transpose(1, 2)
        valid = torch.arange(nblocks * block_size, device=q.device)[None, :] < dlens[:, None]  # [B, S]
        o = F.scaled_dot_product_attention(
            q[rows].unsqueeze(2).to(keys.dtype), keys, values, attn_mask=valid[:, None, None, :], scale=scale, enable_gqa=gqa
        )
        out[rows] = o.squeeze(2).to(q.dtype)

    for i, n in enumerate(q_lens):
        if n <= 1:
            continue
        seq_len = lens[i]
        blocks = tables[i, : -(-seq_len // block_size)]
        keys = k_cache[blocks].flatten(0, 1)[:seq_len].transpose(0, 1).unsqueeze(0)  # [1, KVH, S, D]
        values = v_cache[blocks].flatten(0, 1)[:seq_len].transpose(0, 1).unsqueeze(0)
        qs = q[cu[i] : cu[i + 1]].transpose(0, 1).unsqueeze(0).to(keys.dtype)  # [1, H, n, D]
        if n == seq_len:  # a whole prompt: plain causal attention
            o = F.scaled_dot_product_attention(qs, keys, values, is_causal=True, scale=scale, enable_gqa=gqa)
        else:  # a chunk after cached tokens: token t sees positions <= seq_len - n + t
            positions = torch.arange(seq_len - n, seq_len, device=q.device)
            causal = torch.arange(seq_len, device=q.device)[None, :] <= positions[:, None]
            o = F.scaled_dot_product_attention(qs, keys, values, attn_mask=causal, scale=scale, enable_gqa=gqa)
        out[cu[i] : cu[i + 1]] = o[0].transpose(0, 1).to(q.dtype)
    return out
