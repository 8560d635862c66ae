"""A sequence's prefix-cache hits, looked up once and then checked, not looked up again, while the cache's names change.

Admitting a prompt asks for its hits three times in a step, and a prompt refused for want of blocks asks again on
every step it waits (the head of a long-context queue: tens of thousands of times an hour, about 80 blocks a time).
The cache's names change on nearly every step (blocks named, blocks evicted), the names a waiting prompt hits rarely.
A lookup finds the blocks the index gives the prompt's leading names, up to the first name it lacks or the prompt's
last full block. Later, a fresh lookup finds those same blocks exactly when each of those names still gives its block
and the name the lookup stopped at is still missing: ``BlockPool.register`` adds names and never moves one, ``forget``
drops them (the name then missing, or given to the next oldest block with its content). So a kept answer is checked
by reading its names' blocks in one call and probing the name after them.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from itertools import islice, takewhile
from operator import is_not, itemgetter
from typing import TYPE_CHECKING

from kvsched.allocators.block_prompt import WINDOW

if TYPE_CHECKING:
    from kvsched.allocators.block_pool import BlockPool

_is_block = partial(is_not, None)  # a lookup's hit


class CacheHits:
    """``blocks``: the cached leading full blocks of a sequence (``key``: its id and its length in tokens), as
    the pool's names stood at ``version``."""

    __slots__ = ("key", "version", "blocks", "_names", "_found", "_stop", "_check")

    def __init__(self, key: tuple[int, int], pool: BlockPool, names, more: Callable[[int], list[int]], block_size: int):
        """Look the sequence up: ``names`` are those of its leading full blocks named so far, ``more(n)`` at least
        its first ``n`` (the same list, extended)."""
        num_tokens = key[1]
        full, lookup = num_tokens // block_size, pool.hash_to_block.get
        found = list(takewhile(_is_block, map(lookup, names)))
        while len(found) == len(names) < full:  # hashing a window at a time, it stops near the first miss
            names = more(min(full, len(names) + max(1, WINDOW // block_size)))
            found += takewhile(_is_block, map(lookup, islice(names, len(found), None)))
        self.key, self.version, self._names, self._found, self._check = key, pool.version, names, found, None
        self._stop = names[len(found)] if len(found) < len(names) else None  # the name it lacked
        # At least one token is always left to compute, so that the step can sample from it.
        self.blocks = found[:-1] if found and len(found) * block_size >= num_tokens else found

    def holds(self, pool: BlockPool, names) -> bool:
        """Whether a lookup now would find ``blocks`` again; if so, they are the answer at the pool's version.

        ``names``: the sequence's names now, the very list looked up (a sequence freed since names its blocks anew).
        """
        index, found = pool.hash_to_block, self._found
        if names is not self._names or (self._stop is not None and self._stop in index):
            return False
        if type(index) is not dict and type(names) is list:  # the compiled index reads them all in one call
            if not index.gives(names, found):
                return False
        elif len(found) > 1:
            if self._check is None:  # made at the first check: most lookups are never checked
                self._check = itemgetter(*names[: len(found)]), tuple(found)
            blocks_of, expected = self._check
            try:
                if blocks_of(index) != expected:
                    return False
            except KeyError:  # one of its names was dropped
                return False
        elif found and index.get(names[0]) != found[0]:
            return False
        self.version = pool.version
        return True
