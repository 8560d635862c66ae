"""When vLLM's ``KVCacheManager.allocate_slots`` would change nothing: the steady-decode step, skipped.

A running request that decodes one token almost always has room in its last block (15 steps out
of 16 at block size 16), and then ``allocate_slots`` changes nothing and returns
``empty_kv_cache_blocks``; but it still costs vLLM's whole admission arithmetic, about half of
``realize``'s time at 256 running requests. ``SteadySlots.unchanged`` says so from vLLM's own
state, in a few lookups, for the one layout where that is plain to see: a single KV-cache group of
plain full attention (``FullAttentionManager`` itself: no sliding window, no ring, no sinks),
with no prefix-cache hash unit smaller than a block. Then ``allocate_slots`` for a running request
with no draft tokens does exactly three things, each a no-op when ``unchanged`` holds (the same
in vLLM 0.30 to 0.33):

- ``remove_skipped_blocks``: full attention skips no token;
- ``allocate_new_blocks``: no pending copy-on-write of a partial prefix hit, and the request's
  blocks already hold ``num_tokens`` slots;
- ``cache_blocks``: no block becomes full (every full block among the known tokens is cached).

Anything else (a new block, a block to name, an admission, another layout) goes through
``allocate_slots`` as before, and the free-block check after every step still holds the two
caches equal.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager


class SteadySlots:
    """Answers, for vLLM's KV-cache manager ``kv``, whether a running request's step needs no slot work."""

    def __init__(self, kv: Any) -> None:
        managers = kv.coordinator.single_type_managers
        manager = managers[0] if len(managers) == 1 else None
        if manager is not None and (
            type(manager) is not FullAttentionManager
            or (manager.enable_caching and kv.block_pool.hash_block_size != manager.block_size)
        ):
            manager = None
        self.manager = manager  # None: every step goes through allocate_slots
        self.empty = kv.empty_kv_cache_blocks

    def unchanged(self, request: Any, num_tokens: int) -> bool:
        """True if ``allocate_slots`` for running ``request`` growing to ``num_tokens`` tokens would change nothing."""
        manager = self.manager
        if manager is None:
            return False
        rid = request.request_id
        blocks = manager.req_to_blocks.get(rid)  # .get: the defaultdict must not grow an entry here
        if blocks is None or len(blocks) * manager.block_size < num_tokens or rid in manager._partial_hit_reqs:
            return False
        if manager.enable_caching:
            return min(num_tokens, request.num_tokens) // manager.block_size <= manager.num_cached_block.get(rid, 0)
        return True
