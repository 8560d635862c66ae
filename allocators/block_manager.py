"""Paged KV-cache bookkeeping: block tables, admission answers, copy-on-write, swapping, prefix reuse.

The block manager is the only owner of allocator state. Every mutation can run inside a
transaction (``begin``/``commit``/``rollback``) so that the scheduler can undo a half-built step
when a policy raises, leaving the pools exactly as consistent as before.

A leaf: it imports nothing of the engine, and sees sequences and groups only through the two
small protocols of ``allocators/shapes.py`` (the core's ``Sequence`` and ``SequenceGroup`` satisfy them).
"""

from __future__ import annotations

from functools import partial
from operator import itemgetter
from typing import TYPE_CHECKING

from kvsched.allocators.alloc_status import AllocStatus
from kvsched.allocators.block_pool import BlockPool
from kvsched.allocators.block_prompt import ROOT, chain_hashes
from kvsched.allocators.cache_hits import CacheHits
from kvsched.allocators.compiled import count_held
from kvsched.allocators.journal import Transactions

if TYPE_CHECKING:
    from kvsched.allocators.shapes import Sequence, SequenceGroup


def _num_held(ref_counts: list[int], blocks: list[int]) -> int:
    """How many of ``blocks`` some table holds (a prompt's hits, dozens to hundreds: read in one call)."""
    held = count_held(ref_counts, blocks) if count_held is not None and type(blocks) is list else None  # C
    if held is not None:
        return held
    if len(blocks) > 1:
        return len(blocks) - itemgetter(*blocks)(ref_counts).count(0)
    return sum(map(bool, map(ref_counts.__getitem__, blocks)))


class BlockManager(Transactions):
    """Block tables for every sequence that holds KV blocks, on the GPU or (swapped) on the CPU."""

    def __init__(
        self,
        block_size: int,
        num_gpu_blocks: int,
        num_cpu_blocks: int,
        watermark_blocks: int = 0,
        enable_prefix_caching: bool = False,
        keep_duplicates: bool = False,
    ) -> None:
        self.block_size = block_size
        self.watermark_blocks = watermark_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.gpu = BlockPool("gpu", num_gpu_blocks, keep_duplicates)
        self.cpu = BlockPool("cpu", num_cpu_blocks)
        self.gpu_tables: dict[int, list[int]] = {}
        self.cpu_tables: dict[int, list[int]] = {}
        self._hashes: dict[int, list[int]] = {}  # seq id -> content hash of each full block
        self._registered: dict[int, int] = {}  # seq id -> leading blocks already named in the cache
        self._journal: list[tuple] | None = None
        self._kept = CacheHits((-1, 0), self.gpu, (), list, block_size)  # the last sequence's cache hits

    # ----------------------------------------------------------------------------- queries
    num_free_gpu_blocks = property(lambda self: self.gpu.num_free)
    num_free_cpu_blocks = property(lambda self: self.cpu.num_free)

    def block_table(self, seq_id: int) -> tuple[int, ...]:
        table = self.gpu_tables.get(seq_id)
        if table is None:
            table = self.cpu_tables.get(seq_id, ())
        return tuple(table)

    def num_blocks(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def cached_blocks(self, seq: Sequence) -> list[int]:
        """GPU blocks that already hold this sequence's leading tokens (prefix-cache hits).

        At least one token is always left to compute, so that the step can sample from it.
        """
        return list(self._hits(seq)) if self.enable_prefix_caching else []

    def _hits(self, seq: Sequence) -> list[int]:
        """``cached_blocks`` as the block manager's own list, read and not changed: the last sequence's answer is
        kept while the cache's names stay the same, and checked, not looked up again, once they changed
        (``allocators/cache_hits.py``): admitting a prompt asks three times, a refused one again each step."""
        kept, key, pool = self._kept, (seq.seq_id, seq.num_tokens), self.gpu
        if kept.key != key or kept.version != pool.version and not kept.holds(pool, self._hashes.get(key[0], ())):
            self._kept = kept = CacheHits(
                key, pool, self._hashes.get(key[0], ()), partial(self._block_hashes, seq), self.block_size
            )
        return kept.blocks

    def num_cached_tokens(self, seq: Sequence) -> int:
        return len(self._hits(seq)) * self.block_size if self.enable_prefix_caching else 0

    def planned_cached_tokens(self, group: SequenceGroup) -> dict[int, int]:
        """Per waiting sequence, the leading tokens ``allocate`` will find already computed (or
        computed by the group's first sequence in the same step): what the step need not count."""
        seqs = group.waiting_seqs()
        if len(seqs) == 1:  # the common case: nothing shared
            return {seqs[0].seq_id: self.num_cached_tokens(seqs[0])}
        shared = self._shared_prompt_blocks(seqs) * self.block_size
        return {s.seq_id: self.num_cached_tokens(s) if k == 0 else shared for k, s in enumerate(seqs)}

    def _shared_prompt_blocks(self, seqs: list[Sequence]) -> int:
        """Full prompt blocks that the sequences after the first can share with it.

        Only a recomputed group with several sequences has more than one waiting sequence; their
        prompts are the same, so they share its full blocks again instead of holding copies. The
        first sequence writes that KV in the same step; the others attend to it.
        """
        if len(seqs) < 2:
            return 0
        return len(seqs[0].prompt) // self.block_size

    def blocks_to_allocate(self, group: SequenceGroup, num_tokens: int | None = None) -> int:
        """Free GPU blocks that admitting ``group`` would consume (cache hits on held blocks are free).

        ``num_tokens``: only the first waiting sequence's leading tokens get blocks now (vLLM V1
        allocates a chunked prompt chunk by chunk); None: every token.
        """
        seqs = group.waiting_seqs()
        if len(seqs) == 1 and not self.enable_prefix_caching:  # the common case, without a cache to look in
            return self.num_blocks(seqs[0].num_tokens if num_tokens is None else num_tokens)
        shared = self._shared_prompt_blocks(seqs)
        needed = 0
        for k, seq in enumerate(seqs):
            if k == 0:
                hits = self._hits(seq) if self.enable_prefix_caching else []
                covered = self.num_blocks(
                    seq.num_tokens if num_tokens is None else max(num_tokens, len(hits) * self.block_size)
                )
                needed += covered - _num_held(self.gpu.ref_counts, hits)  # held hits cost no free block
            else:
                needed += self.num_blocks(seq.num_tokens) - shared
        return needed

    def can_allocate(self, group: SequenceGroup) -> AllocStatus:
        """vLLM's watermark rule: NEVER if even an empty pool minus the watermark cannot hold it."""
        seqs = group.waiting_seqs()
        total = sum(self.num_blocks(s.num_tokens) for s in seqs) - self._shared_prompt_blocks(seqs) * (len(seqs) - 1)
        if self.gpu.num_blocks - total < self.watermark_blocks:
            return AllocStatus.NEVER
        if self.gpu.num_free - self.blocks_to_allocate(group) >= self.watermark_blocks:
            return AllocStatus.OK
        return AllocStatus.LATER

    def can_append_slots(self, group: SequenceGroup) -> bool:
        """Worst case: every running sequence may need a fresh block for its next token."""
        return self.gpu.num_free >= group.num_unfinished_seqs

    def blocks_to_append(self, group: SequenceGroup) -> int:
        """Exact number of new blocks (fresh or copy-on-write) the next decode of ``group`` needs."""
        needed = 0
        bs, refs = self.block_size, self.gpu.ref_counts
        for seq in group.unfinished_seqs():
            table = self.gpu_tables[seq.seq_id]
            if seq.num_tokens > len(table) * bs or refs[table[-1]] > 1:
                needed += 1
        return needed

    def blocks_to_grow(self, seq: Sequence, num_tokens: int) -> int:
        """New blocks the sequence's table needs to hold ``num_tokens`` tokens."""
        return max(0, self.num_blocks(num_tokens) - len(self.gpu_tables[seq.seq_id]))

    def unique_blocks(self, group: SequenceGroup, tables: dict[int, list[int]]) -> set[int]:
        """The blocks in ``group``'s tables (``gpu_tables`` or ``cpu_tables``), each once."""
        return {b for s in group.seqs if s.seq_id in tables for b in tables[s.seq_id]}

    def blocks_held(self, group: SequenceGroup) -> tuple[int, int]:
        """The ``(gpu, cpu)`` blocks in ``group``'s tables, each once."""
        return len(self.unique_blocks(group, self.gpu_tables)), len(self.unique_blocks(group, self.cpu_tables))

    def can_swap_out(self, group: SequenceGroup) -> bool:
        return len(self.unique_blocks(group, self.gpu_tables)) <= self.cpu.num_free

    def blocks_to_swap_in(self, group: SequenceGroup) -> int:
        """GPU blocks ``can_swap_in`` asks for (vLLM 0.6.3's count): the group's full blocks, a block
        shared by its sequences once, plus per sequence the one block its next token touches (its
        partial last block, or a new one)."""
        full = set()
        for seq in group.unfinished_seqs():
            # A decoding sequence's table holds every token but the newest; a prompt's, all of it.
            slots = (
                seq.num_tokens - 1 if seq.output and seq.num_computed_tokens == seq.num_tokens - 1 else seq.num_tokens
            )
            full.update(self.cpu_tables.get(seq.seq_id, ())[: slots // self.block_size])
        return len(full) + group.num_unfinished_seqs

    def can_swap_in(self, group: SequenceGroup) -> AllocStatus:
        """vLLM 0.6.3's count: the group's full blocks (a block shared by its sequences once) plus,
        per sequence, the one block its next token touches (its partial last block, or a new one).

        That is exactly what swapping in and decoding once takes, so the decode after a swap-in
        never preempts. NEVER uses the watermark as ``can_allocate`` does (vLLM compares with the
        bare pool, which leaves a group that fits only into the watermark stuck as LATER forever).
        """
        required = self.blocks_to_swap_in(group)
        if self.gpu.num_blocks - required < self.watermark_blocks:
            return AllocStatus.NEVER
        if self.gpu.num_free - required >= self.watermark_blocks:
            return AllocStatus.OK
        return AllocStatus.LATER

    # --------------------------------------------------------------------------- mutations
    def allocate(self, group: SequenceGroup, num_tokens: int | None = None) -> dict[int, int]:
        """Give every waiting sequence of ``group`` GPU blocks for all its tokens (``num_tokens``:
        the first sequence's leading tokens only, as in ``blocks_to_allocate``).

        Returns, per sequence id, how many leading tokens were found in the prefix cache (their
        KV is already there and need not be computed).
        """
        seqs = group.waiting_seqs()
        self._log_tables(seqs)
        if len(seqs) == 1 and not self.enable_prefix_caching:  # the common case: nothing to reuse
            sid = seqs[0].seq_id
            self.gpu_tables[sid] = self.gpu.allocate_many(
                self.num_blocks(seqs[0].num_tokens if num_tokens is None else num_tokens)
            )
            self._registered[sid] = 0
            return {sid: 0}
        shared = self._shared_prompt_blocks(seqs)
        cached: dict[int, int] = {}
        for k, seq in enumerate(seqs):
            reused = self.cached_blocks(seq) if k == 0 else self.gpu_tables[seqs[0].seq_id][:shared]
            self.gpu.take_many(reused)
            tokens = seq.num_tokens if k or num_tokens is None else max(num_tokens, len(reused) * self.block_size)
            table = reused + self.gpu.allocate_many(self.num_blocks(tokens) - len(reused))
            self.gpu_tables[seq.seq_id] = table
            self._registered[seq.seq_id] = len(reused) if k == 0 else 0
            cached[seq.seq_id] = len(reused) * self.block_size
        return cached

    def append_slots(self, seq: Sequence) -> tuple[int, int] | None:
        """Make room for the sequence's newest token; return a (src, dst) copy if the block was shared."""
        table = self.gpu_tables[seq.seq_id]
        if seq.num_tokens > len(table) * self.block_size:
            table.append(self.gpu.allocate())
            if self._journal is not None:
                self._journal.append(("append", seq.seq_id))
            return None
        last = table[-1]
        if self.gpu.ref_counts[last] == 1:
            return None
        new = self.gpu.allocate()
        self.gpu.release(last)
        table[-1] = new
        if self._journal is not None:
            self._journal.append(("cow", seq.seq_id, last))
        return (last, new)

    def append_blocks(self, seqs: list[Sequence]) -> None:
        """``append_slots`` for sequences whose newest token starts a block and whose tables share
        nothing (the decode lane's members): one fresh block each, taken in order, in one call."""
        tables = self.gpu_tables
        for seq, block in zip(seqs, self.gpu.allocate_many(len(seqs))):
            tables[seq.seq_id].append(block)
        if self._journal is not None:
            self._journal += [("append", seq.seq_id) for seq in seqs]

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        """Give the sequence's table fresh blocks until it holds ``num_tokens`` tokens (a V1 prefill chunk)."""
        needed = self.blocks_to_grow(seq, num_tokens)
        if needed:
            table = self.gpu_tables[seq.seq_id]
            if self._journal is not None:  # its length, not a copy of a table of hundreds of blocks each chunk
                self._journal.append(("grew", seq.seq_id, len(table)))
            table += self.gpu.allocate_many(needed)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """The child shares every block of the parent (one more reference each); no copy yet."""
        self._log_tables([child])
        table = list(self.gpu_tables[parent.seq_id])
        self.gpu.take_many(table)
        self.gpu_tables[child.seq_id] = table
        if parent.seq_id in self._hashes:
            self._hashes[child.seq_id] = list(self._hashes[parent.seq_id])
        self._registered[child.seq_id] = self._registered.get(parent.seq_id, 0)

    def swap_out(self, group: SequenceGroup) -> list[tuple[int, int]]:
        """Move the group's blocks to the CPU; a block shared inside the group is copied once."""
        return self._move(group, self.gpu_tables, self.cpu_tables, self.gpu, self.cpu)

    def swap_in(self, group: SequenceGroup) -> list[tuple[int, int]]:
        return self._move(group, self.cpu_tables, self.gpu_tables, self.cpu, self.gpu)

    def _move(self, group, src_tables, dst_tables, src: BlockPool, dst: BlockPool) -> list[tuple[int, int]]:
        seqs = [s for s in group.seqs if s.seq_id in src_tables]
        self._log_tables(seqs)
        mapping: dict[int, int] = {}
        for seq in seqs:
            table = src_tables.pop(seq.seq_id)
            moved = []
            for b in table:
                if b in mapping:
                    dst.take(mapping[b])
                else:
                    mapping[b] = dst.allocate()
                moved.append(mapping[b])
                src.release(b)
            dst_tables[seq.seq_id] = moved
            self._registered[seq.seq_id] = 0
        return list(mapping.items())

    def free(self, seq: Sequence) -> None:
        """Release every block the sequence holds, newest first (so tails are evicted first)."""
        sid = seq.seq_id
        self._hashes.pop(sid, None)  # also for one that never held a block (ignored, aborted while waiting)
        if sid not in self.gpu_tables and sid not in self.cpu_tables:
            return
        self._log_tables([seq])
        self._release(sid)
        self._registered.pop(sid, None)

    def mark_computed(self, seq: Sequence, num_tokens: int | None = None) -> None:
        """Name the sequence's newly completed full blocks in the prefix cache: after the step ran
        (vLLM v0), or, given ``num_tokens``, those the step being scheduled fills (vLLM V1)."""
        if not self.enable_prefix_caching:
            return
        done = (seq.num_computed_tokens if num_tokens is None else num_tokens) // self.block_size
        start = self._registered.get(seq.seq_id, 0)
        if done <= start:
            return
        table, hashes = self.gpu_tables[seq.seq_id], self._block_hashes(seq, done)
        named = self.gpu.register(table[start:done], hashes[start:done])
        if self._journal is not None:  # naming a block the step has yet to fill is undone with the step
            self._journal.append(("named", seq.seq_id, start, named))
        self._registered[seq.seq_id] = done

    def _block_hashes(self, seq: Sequence, n: int) -> list[int]:
        """The content hashes of the sequence's first ``n`` full blocks (at least; computed once)."""
        hashes = chain_hashes(self._hashes.setdefault(seq.seq_id, []), seq.prompt, bs := self.block_size, n)
        for i in range(len(hashes), n):  # blocks that reach into the output
            hashes.append(hash((hashes[-1] if hashes else ROOT, seq.token_slice(i * bs, (i + 1) * bs))))
        return hashes

    content_hashes = _block_hashes  # also the CPU tier's keys (allocators/offloading.py)

    def _release(self, sid: int) -> None:
        table = self.gpu_tables.pop(sid, None)
        pool = self.gpu
        if table is None:
            table, pool = self.cpu_tables.pop(sid), self.cpu
        pool.release_many(table[::-1])

    # ------------------------------------------------------------------------------- audit
    def audit(self) -> list[str]:
        """Every invariant violation, as readable lines (empty when the state is consistent)."""
        problems = []
        for pool, tables in ((self.gpu, self.gpu_tables), (self.cpu, self.cpu_tables)):
            holders = [0] * pool.num_blocks
            for table in tables.values():
                for b in table:
                    holders[b] += 1
            problems += pool.audit(holders)
        both = self.gpu_tables.keys() & self.cpu_tables.keys()
        if both:
            problems.append(f"sequences {sorted(both)} hold blocks on both devices")
        return problems

    def audit_holders(self, running: dict[int, int], swapped: set[int]) -> list[str]:
        """Violations of: exactly the ``running`` sequences (id -> computed tokens, which their table
        must hold) hold GPU blocks, and exactly the ``swapped`` ones CPU blocks."""
        problems = [
            f"sequence {sid} holds GPU blocks but is not running" for sid in self.gpu_tables.keys() - running.keys()
        ]
        problems += [f"sequence {sid} holds CPU blocks but is not swapped" for sid in self.cpu_tables.keys() - swapped]
        problems += [f"running sequence {sid} holds no GPU blocks" for sid in running.keys() - self.gpu_tables.keys()]
        problems += [f"swapped sequence {sid} holds no CPU blocks" for sid in swapped - self.cpu_tables.keys()]
        for sid, computed in running.items():
            if sid in self.gpu_tables and len(self.gpu_tables[sid]) * self.block_size < computed:
                problems.append(f"sequence {sid} has {computed} computed tokens in {len(self.gpu_tables[sid])} blocks")
        return problems

    num_held_blocks = property(
        lambda self: self.gpu.num_blocks - self.gpu.num_free + self.cpu.num_blocks - self.cpu.num_free
    )
