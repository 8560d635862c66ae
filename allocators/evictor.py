"""LRU set of cached blocks that nobody holds: reusable on a prefix hit, evicted only when needed."""

from __future__ import annotations

from itertools import islice


class LRUEvictor:
    """Free-but-cached blocks in least-recently-freed order.

    A block enters when its last holder frees it and it still carries a prefix hash; it leaves
    either because a new prompt hits its hash (``remove``) or because the pool needs a block and
    nothing uncached is free (``evict``, oldest first).

    The order is a queue of block ids read from ``_head``, so that freeing a table and evicting as many blocks
    are a list slice each, where an ordered dict costs two dict operations a block (a long prompt frees and
    evicts hundreds). A block taken back (``remove``) leaves a stale entry, counted in ``_stale`` and skipped
    when the front reaches it. A block is freed again only after it was taken, so its stale entries all come
    before its live one: the front meets them first. The owner knows which blocks are here (its free, named
    ones) and never removes one that is not.
    """

    __slots__ = ("_queue", "_head", "_stale", "_size")

    def __init__(self) -> None:
        self._queue: list[int] = []
        self._head = 0  # entries before it are gone
        self._stale: dict[int, int] = {}  # block -> its stale entries in the queue
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __iter__(self):
        """The blocks, oldest first."""
        stale, live = dict(self._stale), []
        for block in islice(self._queue, self._head, None):
            if stale.get(block):
                stale[block] -= 1
            else:
                live.append(block)
        return iter(live)

    def add(self, block: int) -> None:
        self._queue.append(block)
        self._size += 1

    def add_many(self, blocks: list[int]) -> None:
        self._queue += blocks
        self._size += len(blocks)

    def remove(self, block: int) -> None:
        self._stale[block] = self._stale.get(block, 0) + 1
        self._size -= 1
        if len(self._queue) - self._head > 2 * self._size + 64:  # mostly stale: rebuilt, in time linear in the removals
            self._queue, self._head, self._stale = list(self), 0, {}

    def evict(self) -> int:
        return self.evict_many(1)[0]

    def evict_many(self, n: int) -> list[int]:
        """The ``n`` least recently freed, oldest first (what ``n`` calls of ``evict`` give); ``n`` at most ``len``."""
        queue, head, stale = self._queue, self._head, self._stale
        blocks = queue[head : head + n]
        if stale and not stale.keys().isdisjoint(blocks):  # stale entries among them: the front read one at a time
            blocks = []
            while len(blocks) < n:
                block, head = queue[head], head + 1
                count = stale.pop(block, 0)
                if count > 1:
                    stale[block] = count - 1
                elif not count:
                    blocks.append(block)
        else:
            head += n
        self._size -= n
        if head > 1024 and 2 * head > len(queue):  # the front's gone entries dropped, in time linear in the evictions
            del queue[:head]
            head = 0
        self._head = head
        return blocks
