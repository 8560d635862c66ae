"""Moving K/V between cache slots and blocks: the writes and copies the scheduler's decisions imply.

Caches are indexed by block first (``[num_blocks, block_size, num_kv_heads, head_dim]`` per layer)
unless ``block_dim`` says where the block axis is, so one call can move a block across every layer
and both K and V of a stacked ``[2, num_layers, num_blocks, ...]`` pool.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def reshape_and_cache(
    key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Write ``key``/``value`` ``[T, KVH, D]`` to the slots ``block * block_size + offset``; slot -1 skips the token.

    Indexing by (block, offset) rather than flattening keeps it correct for non-contiguous caches.
    """
    slots = slot_mapping.to(device=k_cache.device, dtype=torch.long)
    keep = slots >= 0
    if not bool(keep.all()):
        slots, key, value = slots[keep], key[keep], value[keep]
    block_size = k_cache.shape[1]
    blocks, offsets = slots // block_size, slots % block_size
    k_cache[blocks, offsets] = key.to(k_cache.dtype)
    v_cache[blocks, offsets] = value.to(v_cache.dtype)


def _index(pairs: Sequence[tuple[int, int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    src = torch.tensor([p[0] for p in pairs], dtype=torch.long, device=device)
    dst = torch.tensor([p[1] for p in pairs], dtype=torch.long)
    return src, dst


def copy_blocks(cache: torch.Tensor, pairs: Sequence[tuple[int, int]], block_dim: int = 0) -> None:
    """Copy-on-write: block ``src`` → block ``dst`` inside one pool, for each ``(src, dst)`` pair.

    All sources are read before any destination is written (a gather then a scatter), so the
    result does not depend on the order of the pairs.
    """
    if not pairs:
        return
    src, dst = _index(pairs, cache.device)
    data = cache.index_select(block_dim, src)
    cache.index_copy_(block_dim, dst.to(cache.device), data)


def swap_blocks(
    src_cache: torch.Tensor, dst_cache: torch.Tensor, pairs: Sequence[tuple[int, int]], block_dim: int = 0
) -> None:
    """Swap out or in: block ``s`` of ``src_cache`` → block ``d`` of ``dst_cache`` (pools may sit on different
    devices)."""
    if not pairs:
        return
    src, dst = _index(pairs, src_cache.device)
    data = src_cache.index_select(block_dim, src).to(dst_cache.device, non_blocking=dst_cache.device.type == "cuda")
    dst_cache.index_copy_(block_dim, dst.to(dst_cache.device), data)
