"""Block manager: unit tests for each rule, and a stateful model that simulates the KV data itself.

The state machine keeps a shadow copy of what every physical block would contain if the
executor obeyed the block manager's instructions (writes through block tables, copy-on-write
pairs, swap maps). After every rule it checks ``audit()`` and that every sequence reads its own
tokens back through its table, which catches a wrong copy-on-write, a bad swap map or a prefix
hit on the wrong content, not just bookkeeping slips.
"""

from __future__ import annotations

from collections import OrderedDict
from itertools import takewhile

import pytest
from helpers import make_group
from hypothesis import assume, given, note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvsched.allocators import AllocStatus, BlockManager
from kvsched.allocators.block_prompt import BlockPrompt
from kvsched.allocators.evictor import LRUEvictor
from kvsched.core.sequence import SequenceStatus

RUNNING, SWAPPED = SequenceStatus.RUNNING, SequenceStatus.SWAPPED


def start(bm: BlockManager, group) -> None:
    """Allocate and 'prefill' a waiting group the way the engine does."""
    cached = bm.allocate(group)
    for s in group.seqs:
        s.status = RUNNING
        s.num_computed_tokens = cached[s.seq_id]
    group.status = RUNNING


def prefilled(bm: BlockManager, tokens):
    """A group started and all its tokens computed: its full blocks named in the prefix cache."""
    group = make_group(tokens)
    start(bm, group)
    group.seqs[0].num_computed_tokens = group.seqs[0].num_tokens
    bm.mark_computed(group.seqs[0])
    return group


# ------------------------------------------------------------------------------- unit tests
def test_can_allocate_ok_later_never_with_watermark():
    bm = BlockManager(block_size=4, num_gpu_blocks=10, num_cpu_blocks=0, watermark_blocks=2)
    assert bm.can_allocate(make_group(range(32))) is AllocStatus.OK  # 8 blocks, 10 - 8 >= 2
    assert bm.can_allocate(make_group(range(33))) is AllocStatus.NEVER  # 9 blocks: 10 - 9 < 2
    start(bm, make_group(range(8)))  # 2 blocks held, 8 free
    assert bm.can_allocate(make_group(range(32))) is AllocStatus.LATER  # 8 - 8 < 2 but fits an empty pool


def test_append_allocates_a_block_at_the_boundary_only():
    bm = BlockManager(4, 8, 0)
    g = make_group(range(4))
    start(bm, g)
    seq = g.seqs[0]
    assert len(bm.gpu_tables[seq.seq_id]) == 1
    seq.append_token(99)  # 5 tokens: the newest needs a second block
    assert bm.append_slots(seq) is None
    assert len(bm.gpu_tables[seq.seq_id]) == 2
    seq.append_token(100)
    assert bm.append_slots(seq) is None and len(bm.gpu_tables[seq.seq_id]) == 2


def test_fork_shares_blocks_and_copy_on_write_splits_the_last_one():
    bm = BlockManager(4, 8, 0)
    g = make_group(range(6), n=2)
    start(bm, g)
    parent = g.seqs[0]
    from kvsched.core.sequence import Sequence

    child = Sequence(parent.seq_id + 1, g, parent.prompt)
    child.status = RUNNING
    bm.fork(parent, child)
    shared = list(bm.gpu_tables[parent.seq_id])
    assert bm.gpu_tables[child.seq_id] == shared and all(bm.gpu.ref_counts[b] == 2 for b in shared)
    parent.append_token(1)
    child.append_token(2)
    cow = bm.append_slots(parent)  # 7 tokens fit in block 2, which is shared: copy it
    assert cow == (shared[1], bm.gpu_tables[parent.seq_id][1])
    assert bm.append_slots(child) is None  # now the child is the block's only holder
    assert bm.gpu.ref_counts[bm.gpu_tables[parent.seq_id][0]] == 2
    assert bm.audit() == []


def test_swap_out_copies_a_shared_block_once_and_swap_in_restores_sharing():
    bm = BlockManager(4, 8, 8)
    g = make_group(range(8), n=2)
    start(bm, g)
    from kvsched.core.sequence import Sequence

    child = Sequence(g.seqs[0].seq_id + 1, g, g.seqs[0].prompt)
    child.status = RUNNING
    bm.fork(g.seqs[0], child)
    g.seqs.append(child)
    g.num_unfinished_seqs = 2
    mapping = bm.swap_out(g)
    assert len(mapping) == 2  # two shared blocks, copied once each
    assert bm.num_free_gpu_blocks == 8 and bm.cpu.ref_counts[mapping[0][1]] == 2
    assert bm.can_swap_in(g) is AllocStatus.OK
    back = bm.swap_in(g)
    assert len(back) == 2 and bm.num_free_cpu_blocks == 8
    assert bm.gpu_tables[g.seqs[0].seq_id] == bm.gpu_tables[child.seq_id]
    assert bm.audit() == []


def test_can_swap_in_never_when_the_group_exceeds_the_pool_minus_watermark():
    bm = BlockManager(4, 6, 8, watermark_blocks=1)
    g = make_group(range(20))  # 5 blocks
    start(bm, g)
    bm.swap_out(g)
    assert bm.can_swap_in(g) is AllocStatus.NEVER  # 5 blocks + 1 spare > 6 - 1


def test_prefix_cache_hits_reuse_blocks_and_evict_lru_only_when_needed():
    bm = BlockManager(4, 6, 0, enable_prefix_caching=True)
    a = prefilled(bm, list(range(8)) + [50])  # 2 full blocks + 1 partial
    full = bm.gpu_tables[a.seqs[0].seq_id][:2]
    b = make_group(list(range(8)) + [60, 61])
    assert bm.num_cached_tokens(b.seqs[0]) == 8
    assert bm.blocks_to_allocate(b) == 1  # both full blocks are held by a: free to share
    start(bm, b)
    assert bm.gpu_tables[b.seqs[0].seq_id][:2] == full and b.seqs[0].num_computed_tokens == 8
    bm.free(a.seqs[0])
    bm.free(b.seqs[0])
    assert bm.num_free_gpu_blocks == 6 and len(bm.gpu.evictor) == 2  # cached, still reusable
    c = make_group(list(range(8)) + [70])
    assert bm.num_cached_tokens(c.seqs[0]) == 8
    d = make_group(range(100, 124))  # needs all 6 blocks: must evict both cached ones
    start(bm, d)
    assert bm.gpu.hash_to_block == {} and bm.num_cached_tokens(c.seqs[0]) == 0
    assert bm.audit() == []


def test_a_fully_cached_prompt_still_computes_its_last_block():
    bm = BlockManager(4, 8, 0, enable_prefix_caching=True)
    prefilled(bm, range(8))
    assert bm.num_cached_tokens(make_group(range(8)).seqs[0]) == 4


def fresh_lookup(bm: BlockManager, seq) -> list[int]:
    """A sequence's cache hits from scratch: the index's blocks for its leading names up to the first it lacks,
    less the last if they cover every token."""
    full = seq.num_tokens // bm.block_size
    hits = list(takewhile(lambda b: b is not None, map(bm.gpu.hash_to_block.get, bm.content_hashes(seq, full)[:full])))
    return hits[:-1] if hits and len(hits) * bm.block_size >= seq.num_tokens else hits


def test_a_kept_answer_reaches_a_block_named_since_at_the_name_it_stopped_at():
    bm = BlockManager(4, 12, 0, enable_prefix_caching=True)
    a = make_group(range(12))
    start(bm, a)
    table = bm.gpu_tables[a.seqs[0].seq_id]
    bm.mark_computed(a.seqs[0], 4)  # V1: the step's first chunk names its block
    queued = make_group([*range(12), 99]).seqs[0]  # refused for want of blocks: asked again each step
    assert bm.cached_blocks(queued) == table[:1]
    bm.mark_computed(a.seqs[0], 8)  # a name added, none dropped: the one the lookup stopped at
    assert bm.cached_blocks(queued) == table[:2] == fresh_lookup(bm, queued)


def test_a_kept_answer_loses_its_blocks_as_they_are_evicted_and_keeps_the_rest():
    bm = BlockManager(4, 6, 0, enable_prefix_caching=True)
    a = prefilled(bm, range(12))
    table = list(bm.gpu_tables[a.seqs[0].seq_id])
    bm.free(a.seqs[0])  # all three cached, the last block the least recently used
    b = make_group(range(100, 112))
    start(bm, b)  # the three free blocks: nothing evicted
    queued = make_group([*range(12), 99]).seqs[0]
    kept = bm._hits(queued)
    assert kept == table
    b.seqs[0].num_computed_tokens = 12
    bm.mark_computed(b.seqs[0])  # names added, not the queued prompt's: its answer checked, not looked up again
    assert bm._hits(queued) is kept
    b.seqs[0].append_token(5)
    bm.append_slots(b.seqs[0])  # a block more: the least recently used cached one evicted, its name dropped
    assert bm.cached_blocks(queued) == table[:2] == fresh_lookup(bm, queued)


def test_a_kept_answer_follows_a_name_to_its_next_oldest_block_v1():
    bm = BlockManager(4, 8, 0, enable_prefix_caching=True, keep_duplicates=True)
    a, b, c = make_group(range(8)), make_group(range(8)), make_group(range(100, 116))
    for g in (a, b, c):
        start(bm, g)  # a and b admitted before either was named: the same content in two pairs of blocks
    for g in (a, b):
        g.seqs[0].num_computed_tokens = 8
        bm.mark_computed(g.seqs[0])
    first, second = list(bm.gpu_tables[a.seqs[0].seq_id]), bm.gpu_tables[b.seqs[0].seq_id]
    queued = make_group([*range(8), 99]).seqs[0]
    assert bm.cached_blocks(queued) == first
    bm.free(a.seqs[0])  # cached; b's copies still held
    c.seqs[0].append_token(5)
    bm.append_slots(c.seqs[0])  # no free block: a's last evicted, and its name passes to b's copy
    assert bm.cached_blocks(queued) == [first[0], second[1]] == fresh_lookup(bm, queued)


def test_free_twice_is_harmless_and_double_release_is_caught():
    bm = BlockManager(4, 4, 0)
    g = make_group(range(4))
    start(bm, g)
    bm.free(g.seqs[0])
    bm.free(g.seqs[0])
    assert bm.num_free_gpu_blocks == 4
    with pytest.raises(RuntimeError, match="double free"):
        bm.gpu.release(0)


def test_rollback_restores_tables_and_ref_counts_exactly():
    bm = BlockManager(4, 12, 8)
    a, b = make_group(range(6)), make_group(range(10))
    start(bm, a)
    start(bm, b)
    before = (dict((k, list(v)) for k, v in bm.gpu_tables.items()), list(bm.gpu.ref_counts), bm.num_free_gpu_blocks)
    bm.begin()
    bm.swap_out(b)
    for t in (1, 2, 3):
        a.seqs[0].append_token(t)
    bm.append_slots(a.seqs[0])
    c = make_group(range(20))
    start(bm, c)
    bm.free(a.seqs[0])
    bm.rollback()
    assert (bm.gpu_tables, bm.gpu.ref_counts, bm.num_free_gpu_blocks) == before
    assert bm.cpu_tables == {} and bm.num_free_cpu_blocks == 8 and bm.audit() == []


def test_rollback_undoes_a_grown_table_with_its_names_and_free_order():
    """A V1 prefill chunk's growth is journaled by its length: undone, the blocks go back to the free stack
    in the order a whole-table undo gave them, unnamed, and the evicted cached blocks stay evicted."""
    bm = BlockManager(4, 12, 0, enable_prefix_caching=True, keep_duplicates=True)
    old = make_group(range(100, 116))
    start(bm, old)
    bm.mark_computed(old.seqs[0], 16)
    bm.free(old.seqs[0])  # four cached free blocks, evicted only when the plain free ones run out
    g = make_group(range(36))
    bm.allocate(g, 8)
    g.seqs[0].status = g.status = RUNNING
    bm.mark_computed(g.seqs[0], 8)
    pool = bm.gpu

    def state():
        return (
            {k: list(v) for k, v in bm.gpu_tables.items()},
            list(pool.ref_counts),
            pool.num_free,
            list(pool._free),
            dict(pool.hash_to_block),
            list(pool.evictor),
            dict(bm._registered),
        )

    before = state()
    bm.begin()
    bm.grow(g.seqs[0], 20)
    bm.mark_computed(g.seqs[0], 20)
    bm.grow(g.seqs[0], 36)  # past the plain free blocks: the oldest cached one evicted
    assert len(bm.gpu_tables[g.seqs[0].seq_id]) == 9 and len(pool.evictor) == 3
    bm.rollback()
    after = state()
    evicted = before[5][0]  # stays evicted: a plain free block now, at the bottom of the stack
    assert after[:3] == before[:3] and after[6] == before[6]
    assert after[3] == [evicted, *before[3]] and after[5] == before[5][1:]
    assert after[4] == {h: b for h, b in before[4].items() if b != evicted}
    assert bm.audit() == []


def test_audit_reports_a_corrupted_ref_count():
    bm = BlockManager(4, 4, 0)
    start(bm, make_group(range(4)))
    bm.gpu.ref_counts[bm.gpu_tables[next(iter(bm.gpu_tables))][0]] += 1
    assert any("ref count 2 but 1 holders" in p for p in bm.audit())


# --------------------------------------------------------------------------- state machine
tokens = st.lists(st.integers(0, 2), min_size=1, max_size=14)


class BlockManagerMachine(RuleBasedStateMachine):
    """Random allocate / decode / fork / swap / free / rollback, against a shadow of the KV data."""

    keep_duplicates = False

    def __init__(self):
        super().__init__()
        self.bs = 2
        self.bm = BlockManager(
            self.bs, 14, 10, watermark_blocks=1, enable_prefix_caching=True, keep_duplicates=self.keep_duplicates
        )
        self.gpu_data: dict[int, dict[int, int]] = {}
        self.cpu_data: dict[int, dict[int, int]] = {}
        self.groups = []

    # -- the shadow executor
    def _compute(self, seq):
        """Write KV for the sequence's uncomputed tokens through its table, as an executor would."""
        table = self.bm.gpu_tables[seq.seq_id]
        for pos in range(seq.num_computed_tokens, seq.num_tokens):
            self.gpu_data.setdefault(table[pos // self.bs], {})[pos % self.bs] = seq.token_slice(pos, pos + 1)[0]
        seq.num_computed_tokens = seq.num_tokens
        self.bm.mark_computed(seq)

    def _copy(self, pairs, src, dst):
        staged = [(d, dict(src.get(s, {}))) for s, d in pairs]
        for d, data in staged:
            dst[d] = data

    def _live(self, status):
        return [g for g in self.groups if g.status is status]

    # -- rules
    @initialize(prompt=tokens)
    def queue(self, prompt):
        """A prompt left waiting, its cache hits asked for after every rule (as a refused one is, each step)."""
        self.queued = make_group(prompt).seqs[0]

    @rule(data=st.data(), prompt=tokens)
    def queue_another(self, data, prompt):
        """Often a live sequence's tokens and more: hits kept, and a next block that sequence may name."""
        seqs = [s for g in self.groups for s in g.unfinished_seqs()]
        head = data.draw(st.sampled_from([None, *seqs]), label="after") if seqs else None
        self.queue(list(head.token_slice(0, head.num_tokens)) + prompt if head is not None else prompt)

    @rule(prompt=tokens, n=st.integers(1, 3))
    def admit(self, prompt, n):
        g = make_group(prompt, n=n)
        status = self.bm.can_allocate(g)
        if status is not AllocStatus.OK:
            return
        start(self.bm, g)
        seq = g.seqs[0]
        self._compute(seq)
        seq.append_token(7)
        for i in range(1, n):
            from kvsched.core.sequence import Sequence

            child = Sequence(seq.seq_id + i, g, seq.prompt, [7 + i])
            child.status, child.num_computed_tokens = RUNNING, seq.num_computed_tokens
            self.bm.fork(seq, child)
            g.seqs.append(child)
        g.num_unfinished_seqs = n
        self.groups.append(g)
        note(f"admit {g.request_id} prompt={prompt} n={n}")

    @rule(
        ids=st.lists(st.integers(0, 3), min_size=1, max_size=5),
        block=st.integers(1, 3),
        cut=st.integers(0, 2),
        n=st.integers(1, 3),
    )
    def admit_blocks(self, ids, block, cut, n):
        """A prompt given as blocks (a hash-id trace's): named without its tokens, a hit only on equal tokens."""
        self.admit(BlockPrompt(ids, max(1, len(ids) * block - min(cut, block - 1)), block), n)

    @precondition(lambda self: self._live(RUNNING))
    @rule(data=st.data(), token=st.integers(0, 2))
    def decode(self, data, token):
        g = data.draw(st.sampled_from(self._live(RUNNING)))
        assume(self.bm.blocks_to_append(g) <= self.bm.num_free_gpu_blocks)
        cows = []
        for s in g.unfinished_seqs():
            cow = self.bm.append_slots(s)
            if cow:
                cows.append(cow)
        self._copy(cows, self.gpu_data, self.gpu_data)
        for s in g.unfinished_seqs():
            self._compute(s)
            s.append_token(token + s.seq_id % 2)

    @precondition(lambda self: self._live(RUNNING))
    @rule(data=st.data())
    def swap_out(self, data):
        g = data.draw(st.sampled_from(self._live(RUNNING)))
        if not self.bm.can_swap_out(g):
            return
        self._copy(self.bm.swap_out(g), self.gpu_data, self.cpu_data)
        g.status = SWAPPED
        for s in g.unfinished_seqs():
            s.status = SWAPPED

    @precondition(lambda self: self._live(SWAPPED))
    @rule(data=st.data())
    def swap_in(self, data):
        g = data.draw(st.sampled_from(self._live(SWAPPED)))
        if self.bm.can_swap_in(g) is not AllocStatus.OK:
            return
        self._copy(self.bm.swap_in(g), self.cpu_data, self.gpu_data)
        g.status = RUNNING
        for s in g.unfinished_seqs():
            s.status = RUNNING

    @precondition(lambda self: any(g.num_unfinished_seqs > 1 for g in self._live(RUNNING)))
    @rule(data=st.data())
    def finish_one_sequence(self, data):
        g = data.draw(st.sampled_from([g for g in self._live(RUNNING) if g.num_unfinished_seqs > 1]))
        s = g.unfinished_seqs()[-1]
        s.status = SequenceStatus.FINISHED_STOPPED
        self.bm.free(s)
        g.num_unfinished_seqs -= 1

    @precondition(lambda self: self.groups)
    @rule(data=st.data())
    def free_group(self, data):
        g = data.draw(st.sampled_from(self.groups))
        for s in g.seqs:
            self.bm.free(s)
        self.groups.remove(g)

    @precondition(lambda self: self._live(RUNNING))
    @rule(data=st.data(), prompt=tokens)
    def rolled_back_transaction(self, data, prompt):
        """Mutations inside begin/rollback leave no trace at all."""
        snapshot = (
            {k: list(v) for k, v in self.bm.gpu_tables.items()},
            {k: list(v) for k, v in self.bm.cpu_tables.items()},
            list(self.bm.gpu.ref_counts),
            list(self.bm.cpu.ref_counts),
        )
        g = data.draw(st.sampled_from(self._live(RUNNING)))
        self.bm.begin()
        if self.bm.can_swap_out(g):
            self.bm.swap_out(g)
        other = make_group(prompt)
        chunk = data.draw(st.sampled_from([None, *range(1, len(prompt) + 1)]), label="chunk")
        if self.bm.can_allocate(other) is AllocStatus.OK:
            self.bm.allocate(other, chunk)  # a chunk (V1): its blocks named, then its table grown to the prompt
            if chunk is not None:
                self.bm.mark_computed(other.seqs[0], chunk)
                self.bm.grow(other.seqs[0], len(prompt))
                self.bm.mark_computed(other.seqs[0], len(prompt))
        for h in self._live(RUNNING):
            if h is not g and self.bm.blocks_to_append(h) <= self.bm.num_free_gpu_blocks:
                for s in h.unfinished_seqs():
                    self.bm.append_slots(s)
        self.bm.rollback()
        assert (
            {k: list(v) for k, v in self.bm.gpu_tables.items()},
            {k: list(v) for k, v in self.bm.cpu_tables.items()},
            list(self.bm.gpu.ref_counts),
            list(self.bm.cpu.ref_counts),
        ) == snapshot

    # -- invariants
    @invariant()
    def audit_is_clean(self):
        assert self.bm.audit() == []

    @invariant()
    def the_queued_prompts_kept_hits_are_a_fresh_lookups(self):
        assert self.bm.cached_blocks(self.queued) == fresh_lookup(self.bm, self.queued)

    @invariant()
    def every_sequence_reads_back_its_tokens(self):
        for g in self.groups:
            for s in g.unfinished_seqs():
                tables, data = (
                    (self.bm.gpu_tables, self.gpu_data) if g.status is RUNNING else (self.bm.cpu_tables, self.cpu_data)
                )
                table = tables[s.seq_id]
                for pos in range(s.num_computed_tokens):
                    stored = data.get(table[pos // self.bs], {}).get(pos % self.bs)
                    assert stored == s.token_slice(pos, pos + 1)[0], f"seq {s.seq_id} pos {pos}"

    def teardown(self):
        for g in self.groups:
            for s in g.seqs:
                self.bm.free(s)
        assert self.bm.num_held_blocks == 0 and self.bm.audit() == []


TestBlockManagerMachine = BlockManagerMachine.TestCase


class DuplicatesMachine(BlockManagerMachine):
    """The same under V1's names: a block computed twice keeps both, and a name evicted passes to the next oldest."""

    keep_duplicates = True


TestDuplicatesMachine = DuplicatesMachine.TestCase


def test_recomputed_group_shares_its_full_prompt_blocks_again():
    from kvsched.core.sequence import Sequence

    bm = BlockManager(4, 16, 0)
    g = make_group(range(9), n=2)  # 2 full prompt blocks + 1 token
    a = g.seqs[0]
    a.append_token(1)
    a.append_token(2)
    b = Sequence(a.seq_id + 1, g, a.prompt, [3, 4])
    g.seqs.append(b)
    g.num_unfinished_seqs = 2
    assert bm.blocks_to_allocate(g) == 3 + 3 - 2  # 11 tokens = 3 blocks each, two shared
    planned = bm.planned_cached_tokens(g)
    cached = bm.allocate(g)
    assert planned == cached
    ta, tb = bm.gpu_tables[a.seq_id], bm.gpu_tables[b.seq_id]
    assert ta[:2] == tb[:2] and ta[2] != tb[2]
    assert cached == {a.seq_id: 0, b.seq_id: 8}  # b attends to the prompt KV that a writes
    assert bm.num_free_gpu_blocks == 12 and bm.audit() == []


@given(
    st.lists(st.tuples(st.sampled_from(["free", "take", "evict"]), st.integers(0, 11), st.integers(1, 5)), max_size=300)
)
def test_the_evictors_order_is_an_ordered_dicts(ops):
    """The queue with stale entries (blocks taken back, freed again, evicted one or many at a time, rebuilt when
    mostly stale) keeps exactly the least-recently-freed order of an ``OrderedDict`` of the same blocks."""
    evictor, model, held = LRUEvictor(), OrderedDict(), set(range(12))
    for op, block, n in ops:
        if op == "free":  # the blocks ``block .. block + n - 1`` that nobody holds now
            blocks = [b for b in range(block, block + n) if b in held]
            held.difference_update(blocks)
            evictor.add(blocks[0]) if len(blocks) == 1 else evictor.add_many(blocks)
            model.update(dict.fromkeys(blocks))
        elif op == "take" and block in model:  # a prefix hit takes a cached block back
            evictor.remove(block)
            del model[block]
            held.add(block)
        elif op == "evict" and model:
            n = min(n, len(model))
            expected = [model.popitem(last=False)[0] for _ in range(n)]
            assert (evictor.evict() if n == 1 else evictor.evict_many(n)) == (expected[0] if n == 1 else expected)
            held.update(expected)
        assert list(evictor) == list(model) and len(evictor) == len(model)


def test_blocks_taken_back_and_freed_again_do_not_grow_the_evictor():
    """A cache that is hit again and again but never evicts from: its stale entries are dropped (the queue is
    rebuilt), so it stays as large as the blocks in it and keeps their order."""
    evictor, model = LRUEvictor(), OrderedDict()
    evictor.add_many(list(range(10)))
    model.update(dict.fromkeys(range(10)))
    for k in range(1_000):
        block = 3 + k % 4
        evictor.remove(block)
        evictor.add(block)
        model.move_to_end(block)
    assert list(evictor) == list(model) and len(evictor._queue) - evictor._head < 100
    assert evictor.evict_many(10) == list(model) and len(evictor) == 0
