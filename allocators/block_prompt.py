"""Prompts given as blocks, and the chained content hash that names a sequence's full blocks.

A hash-id trace (Mooncake's format, ``workloads/prefix_trace.py``) gives a prompt as one id per
``block`` tokens, equal ids equal blocks; block ``h`` holds the token ids ``h * block, h * block + 1, ...``,
the last block cut to the prompt's length. ``BlockPrompt`` is such a prompt kept as its ids: it reads as
the tuple of its token ids (length, items, slices, iteration, equality), but makes only the tokens a reader
asks for, so a queued 100k-token prompt costs a few hundred ids, not 100k Python ints; an executor that
needs the ids (vLLM's) reads them all.

``chain_hashes`` names each full block of ``block_size`` tokens by the hash of its parent's name and its
content, so equal names mean equal prefixes; the engine's block manager and the prefix-aware routers both
use it, so a router's names are a replica's. The content is the block's token ids, except inside one block
of a ``BlockPrompt``, where it is a run of consecutive ids and its first id says it all: such a block is
named without making a token. Two ``BlockPrompt`` blocks are named alike exactly when their tokens are
equal (a run inside one block never equals a block that spans two, whose ids are its name), so prefix hits
are those of the tokens; a ``BlockPrompt`` and a tuple of the same ids are not (no workload mixes them).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

from kvsched.allocators.compiled import name_inside

ROOT = 0x9E3779B97F4A7C15  # the parent of every chain's first block
MAX_ID = 2**63 - 1  # token ids are int64 (the results' columns, vLLM's)
WINDOW = 512  # tokens named at a time while the cache is searched for a prompt's blocks (the search stops near a miss)


class BlockPrompt(Sequence):
    """A prompt of ``length`` tokens given as the hash ids of its ``block``-token blocks."""

    __slots__ = ("hash_ids", "length", "block")

    def __init__(self, hash_ids: tuple[int, ...], length: int, block: int) -> None:
        hash_ids = tuple(hash_ids)
        if not (type(block) is int and block >= 1 and type(length) is int and length >= 1):
            raise ValueError(f"a prompt as blocks needs a length and a block size of at least 1: {length}, {block}")
        if len(hash_ids) != -(-length // block):
            raise ValueError(f"{len(hash_ids)} hash ids for {length} tokens: expected one per {block}-token block")
        if any(type(h) is not int for h in hash_ids) or min(hash_ids) < 0 or max(hash_ids) > MAX_ID // block - 1:
            raise ValueError(f"hash ids must be integers from 0 to {MAX_ID // block - 1:,} (token ids are int64)")
        self.hash_ids, self.length, self.block = hash_ids, length, block

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index):
        if isinstance(index, slice):
            start, stop, step = index.indices(self.length)
            return self.tokens(start, stop) if step == 1 else tuple(self)[index]
        if index < 0:
            index += self.length
        if not 0 <= index < self.length:
            raise IndexError("prompt index out of range")
        q, r = divmod(index, self.block)
        return self.hash_ids[q] * self.block + r

    def tokens(self, start: int, stop: int) -> tuple[int, ...]:
        """Token ids ``[start, stop)`` (within the prompt), made from the blocks they fall in."""
        if stop <= start:
            return ()
        b, ids = self.block, self.hash_ids
        first, last = start // b, (stop - 1) // b
        if first == last:  # the common read: a window inside one block
            base = ids[first] * b - first * b
            return tuple(range(base + start, base + stop))
        pieces = [range(ids[q] * b, ids[q] * b + b) for q in range(first, last + 1)]
        pieces[0] = pieces[0][start - first * b :]
        pieces[-1] = pieces[-1][: stop - last * b]
        return tuple(chain.from_iterable(pieces))

    def __iter__(self):
        b, end = self.block, self.length
        for q, h in enumerate(self.hash_ids):
            yield from range(h * b, h * b + min(b, end - q * b))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, BlockPrompt) and other.block == self.block:
            return other.length == self.length and other.hash_ids == self.hash_ids
        if isinstance(other, (tuple, list, range, BlockPrompt)):
            return len(other) == self.length and tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))  # equal to the tuple of its tokens, so hashed alike

    def __add__(self, other: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(self) + tuple(other)

    def name_blocks(self, hashes: list[int], block_size: int, n: int) -> None:
        """``chain_hashes`` for this prompt: a block that lies inside one of its blocks holds the run of ids
        from its first, and is named by that id, not by the ids themselves (none are made); one that spans
        two of its blocks is named by its ids, as any other."""
        b, ids = self.block, self.hash_ids
        while len(hashes) < n:
            j, parent = len(hashes), hashes[-1] if hashes else ROOT
            if name_inside is not None:  # the loop over the blocks inside, in C
                name_inside(hashes, parent, ids, b, block_size, n)
                if len(hashes) > j:
                    continue
            q = j * block_size // b
            inside = min(n, (q + 1) * b // block_size)  # blocks j .. inside - 1 end by the end of block q
            if inside > j:
                offset = ids[q] * b - q * b  # a token's id is its position plus this
                for first in range(offset + j * block_size, offset + inside * block_size, block_size):
                    parent = hash((parent, first))
                    hashes.append(parent)
            else:
                hashes.append(hash((parent, self.tokens(j * block_size, (j + 1) * block_size))))

    def __reduce__(self):
        return BlockPrompt, (self.hash_ids, self.length, self.block)

    def __repr__(self) -> str:
        return f"BlockPrompt({len(self.hash_ids)} blocks of {self.block}, {self.length} tokens)"


def chain_hashes(hashes: list[int], tokens: Sequence[int], block_size: int, n: int) -> list[int]:
    """Extend ``hashes``, the names of the leading full blocks of ``tokens`` (a tuple, a range or a
    ``BlockPrompt``), to its first ``n`` full blocks (at most as many as there are); return it."""
    if type(tokens) is BlockPrompt:
        tokens.name_blocks(hashes, block_size, min(n, len(tokens) // block_size))
        return hashes
    parent = hashes[-1] if hashes else ROOT
    for start in range(len(hashes) * block_size, min(n, len(tokens) // block_size) * block_size, block_size):
        parent = hash((parent, tuple(tokens[start : start + block_size])))
        hashes.append(parent)
    return hashes
