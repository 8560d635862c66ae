"""LRU set of cached blocks that nobody holds: reusable on a prefix hit, evicted only when needed."""

from __future__ import annotations

from collections import OrderedDict
from itertools import islice


class LRUEvictor:
    """Free-but-cached blocks in least-recently-freed order.

    A block enters when its last holder frees it and it still carries a prefix hash; it leaves
    either because a new prompt hits its hash (``remove``) or because the pool needs a block and
    nothing uncached is free (``evict``, oldest first).
    """

    __slots__ = ("_order",)

    def __init__(self) -> None:
        self._order: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, block: int) -> bool:
        return block in self._order

    def __iter__(self):
        return iter(self._order)

    def add(self, block: int) -> None:
        self._order[block] = None

    def add_many(self, blocks: list[int]) -> None:
        order = self._order  # OrderedDict.update is a Python loop slower than this one
        for block in blocks:
            order[block] = None

    def remove(self, block: int) -> None:
        del self._order[block]

    def evict(self) -> int:
        block, _ = self._order.popitem(last=False)
        return block

    def evict_many(self, n: int) -> list[int]:
        """The ``n`` least recently freed, oldest first (what ``n`` calls of ``evict`` give)."""
        order = self._order
        blocks = list(islice(order, n))
        for block in blocks:
            del order[block]
        return blocks
