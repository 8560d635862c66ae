"""The physical blocks of one device: ref counts, a free set and (GPU only) the prefix cache."""

from __future__ import annotations

from operator import itemgetter

from kvsched.allocators.compiled import (  # noqa: F401 (index_in_use: engine policies')
    COMPILED_INDEX,
    NameIndex,
    forget_names,
    hold_refs,
    index_in_use,
    register_names,
    release_refs,
)
from kvsched.allocators.evictor import LRUEvictor


class OutOfBlocks(RuntimeError):
    """Raised when a pool is asked for more blocks than it has free (a bug in the caller)."""


class BlockPool:
    """Blocks ``0..num_blocks-1`` of one device.

    A block is *held* (ref count > 0, one count per block table that holds it), *free*, or, with
    prefix caching, *cached*: ref count 0 but still named by a content hash, kept in an LRU
    evictor so that a later prompt with the same prefix can take it back without recomputing.
    Cached blocks count as free: they are evicted, oldest first, only when no plain free block is
    left. With ``keep_duplicates`` (vLLM V1) a block whose content is already cached is named too,
    and a lookup finds the oldest of the blocks with that content; otherwise the first writer wins.
    """

    __slots__ = (
        "device",
        "num_blocks",
        "num_free",
        "ref_counts",
        "_free",
        "evictor",
        "hash_to_block",
        "block_hash",
        "keep_duplicates",
        "_duplicates",
        "version",
    )

    def __init__(self, device: str, num_blocks: int, keep_duplicates: bool = False) -> None:
        self.device = device
        self.num_blocks = num_blocks
        self.num_free = num_blocks  # plain free plus cached; kept in step because the scheduler reads it per group
        self.ref_counts = [0] * num_blocks
        # A stack: the newest freed block is taken first, and a table comes and goes by slices. Only
        # an undone step takes a particular free block back (``take``), a search of the stack.
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self.evictor = LRUEvictor()
        # content hash -> the block a lookup finds: a dict, or the same mapping as a compact table
        self.hash_to_block: dict[int, int] = NameIndex(num_blocks) if COMPILED_INDEX else {}
        self.block_hash: list[int | None] = [None] * num_blocks  # each block's content hash, None while unnamed
        self.keep_duplicates = keep_duplicates
        self._duplicates: dict[int, list[int]] = {}  # content hash -> younger blocks with it, oldest first
        self.version = 0  # counts the changes of names: a lookup's answer holds while it stays

    def is_free(self, block: int) -> bool:
        return self.ref_counts[block] == 0

    def allocate(self) -> int:
        """Take a free block (uncached first, else evict the least recently used cached one)."""
        if self._free:
            block = self._free.pop()
        elif self.evictor:
            block = self.evictor.evict()
            self.forget((block,))
        else:
            raise OutOfBlocks(f"{self.device} pool has no free block")
        self.ref_counts[block] = 1
        self.num_free -= 1
        return block

    def allocate_many(self, n: int) -> list[int]:
        """``n`` blocks, the same ones ``n`` calls of ``allocate`` would give (a prompt takes dozens)."""
        free = self._free
        if len(free) < n:  # every free block, then the least recently used cached ones
            if len(free) + len(self.evictor) < n:
                raise OutOfBlocks(f"{self.device} pool has {self.num_free} free blocks, {n} asked for")
            blocks, evicted = free[::-1], self.evictor.evict_many(n - len(free))
            free.clear()
            self.forget(evicted)
            blocks += evicted
        else:
            blocks = free[-n:] if n else []
            blocks.reverse()  # the newest first, as n calls of allocate() take them
            del free[len(free) - n :]
        # In C for many blocks (a prompt's); a few (the decode lane's due blocks) cost less here than a cold C call.
        if n < 8 or type(self.hash_to_block) is dict or not hold_refs(self.ref_counts, blocks):
            ref_counts = self.ref_counts
            for block in blocks:
                ref_counts[block] = 1
        self.num_free -= n
        return blocks

    def take(self, block: int) -> None:
        """Hold one more reference to ``block``; if nobody held it, take it out of the free set."""
        self.take_many((block,))

    def take_many(self, blocks) -> None:
        """``take`` each of ``blocks`` in order (a long prompt's cache hits: hundreds)."""
        ref_counts, named = self.ref_counts, self.block_hash
        for block in blocks:
            if ref_counts[block] == 0:
                if named[block] is not None:  # a free block is cached exactly when it is named
                    self.evictor.remove(block)
                else:
                    self._free.remove(block)
                self.num_free -= 1
            ref_counts[block] += 1

    def release(self, block: int) -> None:
        """Drop one reference; at zero the block becomes free (cached if it carries a hash)."""
        count = self.ref_counts[block] - 1
        if count < 0:
            raise RuntimeError(f"double free of {self.device} block {block}")
        self.ref_counts[block] = count
        if count == 0:
            self.num_free += 1
            if self.block_hash[block] is not None:
                self.evictor.add(block)
            else:
                self._free.append(block)

    def release_many(self, blocks: list[int]) -> None:
        """``release`` each of ``blocks`` in order (a finished sequence gives back its whole table)."""
        if type(self.hash_to_block) is not dict and type(blocks) is list:  # the same loop in C
            released = release_refs(self.ref_counts, self.block_hash, blocks)
            if released is not None:  # None: a block id it leaves to the Python code
                gone, unnamed, stop = released
                self._free_all(gone, unnamed)
                if stop >= 0:
                    raise RuntimeError(f"double free of {self.device} block {blocks[stop]}")
                return
        ref_counts, gone = self.ref_counts, []
        try:
            # no other table holds any, and none is given twice (its second release a double free)
            if len(blocks) > 1 and itemgetter(*blocks)(ref_counts).count(1) == len(blocks) == len(set(blocks)):
                for block in blocks:
                    ref_counts[block] = 0
                gone = blocks
            else:
                for block in blocks:
                    count = ref_counts[block] - 1
                    if count < 0:
                        raise RuntimeError(f"double free of {self.device} block {block}")
                    ref_counts[block] = count
                    if count == 0:
                        gone.append(block)
        finally:  # those released before a double free stay released: cached if named (as ``release`` does), else free
            self._free_all(gone, None)

    def _free_all(self, gone: list[int], unnamed: int | None) -> None:
        """The blocks ``gone`` (no table holds them now, ``unnamed`` of them without a name if known) become free:
        cached, the newest last, if named, else plain free."""
        names = None
        if unnamed is None:
            names = list(map(self.block_hash.__getitem__, gone)) if self.hash_to_block else ()  # () while none named
            unnamed = names.count(None) if names else len(gone)
        if not unnamed:
            self.evictor.add_many(gone)
        elif unnamed == len(gone):
            self._free += gone
        elif unnamed == 1 and self.block_hash[gone[0]] is None:  # a table's partial last block comes first
            self._free.append(gone[0])
            self.evictor.add_many(gone[1:])
        else:
            names = names or list(map(self.block_hash.__getitem__, gone))
            self.evictor.add_many([block for block, name in zip(gone, names) if name is not None])
            self._free += [block for block, name in zip(gone, names) if name is None]
        self.num_free += len(gone)

    def lookup(self, content_hash: int) -> int | None:
        return self.hash_to_block.get(content_hash)

    def register(self, blocks: list[int], content_hashes: list[int]) -> list[int]:
        """Name held, fully written blocks by their content hashes (see the class docstring); those named."""
        self.version += 1
        if type(self.hash_to_block) is not dict:  # the same loop in C
            done = register_names(
                self.hash_to_block, self.block_hash, blocks, content_hashes, self.keep_duplicates, self._duplicates
            )
            if done is not None:  # None: a block id it leaves to the Python loop
                return done
        named, first_of, keep, done = self.block_hash, self.hash_to_block.setdefault, self.keep_duplicates, []
        for block, content_hash in zip(blocks, content_hashes):  # one probe of the index a block
            if named[block] is not None:
                continue
            if first_of(content_hash, block) != block:  # the content is cached in another block already
                if not keep:
                    continue
                self._duplicates.setdefault(content_hash, []).append(block)
            named[block] = content_hash
            done.append(block)
        return done

    def forget(self, blocks) -> None:
        """The blocks lose their names (evicted, or their step undone before they were filled); for each,
        the next oldest block with the same content takes over."""
        named, index, duplicates = self.block_hash, self.hash_to_block, self._duplicates
        self.version += 1
        if not duplicates:  # the common case: each the only block with its content, in the index
            if type(index) is not dict and forget_names(index, named, blocks):  # the same loop in C
                return
            for block in blocks:
                del index[named[block]]
                named[block] = None
            return
        hashes = [named[block] for block in blocks]
        for block in blocks:
            named[block] = None
        if duplicates.keys().isdisjoint(hashes):
            for content_hash in hashes:
                del index[content_hash]
            return
        for block, content_hash in zip(blocks, hashes):
            younger = duplicates.get(content_hash)
            if younger is None:
                del index[content_hash]
                continue
            if index[content_hash] == block:
                index[content_hash] = younger.pop(0)
            else:
                younger.remove(block)
            if not younger:
                del duplicates[content_hash]

    def audit(self, holders: list[int]) -> list[str]:
        """Invariant violations, given the number of block tables holding each block."""
        problems = []
        free_set, cached = set(self._free), list(self.evictor)
        if len(free_set) != len(self._free):
            problems.append(f"{self.device}: a block is free twice")
        free, cached_set = len(self._free) + len(self.evictor), set(cached)
        if len(cached_set) != len(cached) or len(cached) != len(self.evictor):
            problems.append(f"{self.device}: a block is cached twice, or the cache miscounts")
        if free != self.num_free:
            problems.append(f"{self.device}: free count {self.num_free} but {free} blocks free")
        held = sum(1 for c in self.ref_counts if c > 0)
        if free + held != self.num_blocks:
            problems.append(f"{self.device}: free {free} + held {held} != total {self.num_blocks}")
        for block, (count, n) in enumerate(zip(self.ref_counts, holders)):
            if count < 0:
                problems.append(f"{self.device} block {block}: ref count {count} < 0")
            if count != n:
                problems.append(f"{self.device} block {block}: ref count {count} but {n} holders")
            if count > 0 and (block in free_set or block in cached_set):
                problems.append(f"{self.device} block {block}: held and free at once")
        if free_set & cached_set:
            problems.append(f"{self.device}: a block is both free and cached")
        for block in cached:
            if self.block_hash[block] is None:
                problems.append(f"{self.device} block {block}: cached without a hash")
        named = [(h, b) for h, b in self.hash_to_block.items()] + [
            (h, b) for h, bs in self._duplicates.items() for b in bs
        ]
        for h, block in named:
            if self.block_hash[block] != h:
                problems.append(f"{self.device} block {block}: hash index out of sync")
        num_named = self.num_blocks - self.block_hash.count(None)
        if len(named) != num_named:
            problems.append(f"{self.device}: {num_named} named blocks but {len(named)} in the hash index")
        return problems
