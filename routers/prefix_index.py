"""Prefix hashes of a prompt, and the router-side table of which replica was sent which prefix.

``prefix_hashes`` chains a hash over each full block of tokens the way the engine's block manager
names its cached blocks (``allocators/block_manager.py``), so that one list of hashes asks both the
router's own table and a replica's real cache (``tests/test_routers.py`` checks that they agree).
``PrefixIndex`` is what llm-d's prefix-cache scorer and SGLang's cache-aware router keep: an
approximation of each replica's cache built from what the router sent it, LRU-bounded per replica.
"""

from __future__ import annotations

from collections import OrderedDict

from kvsched.allocators.block_prompt import chain_hashes


def prefix_hashes(token_ids: tuple[int, ...], block_size: int) -> list[int]:
    """The chained content hash of each full block of ``token_ids`` (none for a prompt given by length)."""
    return chain_hashes([], token_ids, block_size, len(token_ids) // block_size)


class PrefixIndex:
    """Per replica, the block hashes the router sent it (most recent last), at most ``capacity`` each."""

    def __init__(self, capacity: int = 31_250) -> None:  # llm-d's lruCapacityPerServer default
        self.capacity = capacity
        self._lru: dict[str, OrderedDict[int, None]] = {}
        self._holders: dict[int, set[str]] = {}  # hash -> replicas whose table has it

    def size(self, replica: str) -> int:
        """Blocks in the replica's table (SGLang's cache-aware router sends a miss to the smallest)."""
        table = self._lru.get(replica)
        return len(table) if table else 0

    def matches(self, hashes: list[int]) -> dict[str, int]:
        """Per replica whose table holds the first block: how many leading blocks it holds."""
        depth: dict[str, int] = {}
        candidates = None
        for i, h in enumerate(hashes):
            holders = self._holders.get(h)
            if not holders:
                break
            candidates = set(holders) if candidates is None else candidates & holders
            if not candidates:
                break
            for name in candidates:
                depth[name] = i + 1
        return depth

    def insert(self, replica: str, hashes: list[int]) -> None:
        """Record that ``replica`` was sent these blocks (now its most recent), evicting its oldest beyond capacity."""
        table = self._lru.setdefault(replica, OrderedDict())
        for h in hashes:
            if h in table:
                table.move_to_end(h)
            else:
                table[h] = None
                self._holders.setdefault(h, set()).add(replica)
        while len(table) > self.capacity:
            old, _ = table.popitem(last=False)
            holders = self._holders[old]
            holders.discard(replica)
            if not holders:
                del self._holders[old]
