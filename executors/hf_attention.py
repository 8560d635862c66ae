"""Our paged attention as a transformers attention backend.

HF keeps running its own embeddings, RoPE, norms, MLPs and LM head (so numerics match
``generate()`` outside attention); each attention layer hands us the new tokens' Q/K/V, we write
K/V into the paged cache through the slot mapping and attend over the block tables. Per-step
metadata travels in a module-level context set around each forward, not through kwargs (older
GPT-2 code did not forward kwargs).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kvsched.kernels import PagedKVCache, reshape_and_cache

ATTN_NAME = "kvsched_paged"


@dataclass
class StepMetadata:
    """One packed forward: where each token's K/V goes and what each sequence attends to."""

    slot_mapping: torch.Tensor  # [T] block * block_size + offset
    cu_seqlens_q: torch.Tensor  # [B + 1]
    seq_lens: torch.Tensor  # [B] tokens in the cache after this step
    block_tables: torch.Tensor  # [B, max_blocks]
    max_query_len: int


@dataclass
class _Active:
    cache: PagedKVCache
    meta: StepMetadata
    attend: Callable[..., torch.Tensor]


_ACTIVE: _Active | None = None


@contextlib.contextmanager
def active_step(cache: PagedKVCache, meta: StepMetadata, attend: Callable[..., torch.Tensor]):
    global _ACTIVE
    previous, _ACTIVE = _ACTIVE, _Active(cache, meta, attend)
    try:
        yield
    finally:
        _ACTIVE = previous


def paged_attention_forward(module, query, key, value, attention_mask=None, scaling=None, dropout=0.0, **kwargs):
    """The function transformers calls per layer: ``query [1, H, T, D]``, ``key``/``value [1, KVH, T, D]``."""
    active = _ACTIVE
    if active is None:
        raise RuntimeError(f"attention {ATTN_NAME!r} was called outside an executor step")
    m, cache, layer = active.meta, active.cache, module.layer_idx
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    q = query[0].transpose(0, 1)
    k = key[0].transpose(0, 1)
    v = value[0].transpose(0, 1)
    k_cache, v_cache = cache.key(layer), cache.value(layer)
    reshape_and_cache(k, v, k_cache, v_cache, m.slot_mapping)
    out = active.attend(q.contiguous(), k_cache, v_cache, m.cu_seqlens_q, m.seq_lens, m.block_tables, scaling)
    return out.unsqueeze(0), None


def register() -> str:
    """Register the backend with transformers (idempotent) and return its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_NAME, paged_attention_forward)
    return ATTN_NAME
