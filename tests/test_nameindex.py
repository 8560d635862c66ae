"""The allocators' loops in C (allocators/_nameindex.c) against the Python code they replace.

Two state machines: the prefix cache's index as a table and a dict given the same random operations (names that
share a home slot so that probing runs wrap around the table's end and deletions shift them back, int64's
extremes, names beyond int64, growth past the size it was made for); and two pools, one on each index (the C loops
and the Python ones), given the same random allocations, namings, extra references and releases, whose whole state
must stay equal. And a prompt's run of blocks named in C as in Python. Without the built module these skip, saying
so, except under ``make test`` (KVSCHED_REQUIRE_COMPILED=1), where the module must be built and in use.
"""

from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvsched.allocators import block_manager, block_pool, block_prompt
from kvsched.allocators.block_pool import BlockPool, NameIndex
from kvsched.allocators.block_prompt import ROOT, BlockPrompt

needs_c = pytest.mark.skipif(
    NameIndex is None, reason="allocators/_nameindex.c is not built (make compiled, or pip install -e .)"
)


def test_the_compiled_index_is_in_use_under_make_test():
    if os.environ.get("KVSCHED_REQUIRE_COMPILED") != "1":
        pytest.skip("KVSCHED_REQUIRE_COMPILED is not set (make test sets it)")
    assert NameIndex is not None, "kvsched.allocators._nameindex is not built: `make test` builds it"
    assert block_pool.COMPILED_INDEX, "KVSCHED_DICT_INDEX=1: the pool runs on a dict"
    assert type(BlockPool("gpu", 4).hash_to_block) is NameIndex


@needs_c
@pytest.mark.parametrize("value, compiled", [("1", False), ("yes", False), ("0", True), ("", True)])
def test_only_a_set_kvsched_dict_index_forces_the_dict(value, compiled):
    """Before: any value, "0" included, forced the dict."""
    env = {**os.environ, "KVSCHED_DICT_INDEX": value}
    code = "from kvsched.allocators import block_pool as b; print(b.COMPILED_INDEX)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(compiled)


# A table made for up to 4 blocks has 16 slots; its slot for a name is the top 4 bits of name * 0x9E37...15.
def _home(name: int) -> int:
    return ((name * 0x9E3779B97F4A7C15) % 2**64) >> 60


_LAST_SLOT = [n for n in range(-(2**20), 2**20) if _home(n) == 15][:12]  # their runs wrap round to slot 0
_FIRST_SLOT = [n for n in range(-(2**20), 2**20) if _home(n) == 0][:6]
names = st.one_of(
    st.sampled_from(_LAST_SLOT + _FIRST_SLOT),
    st.sampled_from([-(2**63), 2**63 - 1, 0, -1, 2**63, -(2**63) - 1, 2**100]),  # the last three: beyond int64
    st.integers(-(2**63), 2**63 - 1),
)
blocks = st.integers(0, 2**31 - 1)


class IndexMachine(RuleBasedStateMachine):
    """The table and a dict, the same operations; after each, the same answers and the same contents."""

    def __init__(self):
        super().__init__()
        self.table, self.model = NameIndex(4), {}

    @rule(name=names, block=blocks)
    def setdefault(self, name, block):
        assert self.table.setdefault(name, block) == self.model.setdefault(name, block)

    @rule(name=names, block=blocks)
    def set(self, name, block):
        self.table[name] = self.model[name] = block

    @rule(name=names)
    def delete(self, name):
        if name in self.model:
            del self.table[name], self.model[name]
        else:
            with pytest.raises(KeyError):
                del self.table[name]

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def delete_a_present_one(self, data):
        name = data.draw(st.sampled_from(sorted(self.model)))
        del self.table[name], self.model[name]

    @rule(name=names)
    def look_up(self, name):
        assert self.table.get(name) == self.model.get(name)
        assert self.table.get(name, "none") == self.model.get(name, "none")
        assert (name in self.table) == (name in self.model)
        if name not in self.model:
            with pytest.raises(KeyError):
                self.table[name]

    @rule(data=st.data())
    def gives(self, data):
        """Whether each of a list of names gives the block at its place (a kept cache hit's check)."""
        chosen = data.draw(st.lists(st.one_of(names, st.sampled_from(sorted(self.model) or [0])), max_size=6))
        given = [self.model.get(name, 0) for name in chosen][: data.draw(st.integers(0, len(chosen) + 1))]
        if given and data.draw(st.booleans()):
            given[-1] += 1  # one block that is not its name's
        expected = len(chosen) >= len(given) and all(self.model.get(n) == b for n, b in zip(chosen, given))
        assert self.table.gives(chosen, given) is expected

    @rule()
    def copy_and_pickle(self):
        for other in (copy.copy(self.table), copy.deepcopy(self.table), pickle.loads(pickle.dumps(self.table))):
            assert type(other) is NameIndex and other == self.model

    @invariant()
    def same_contents(self):
        assert len(self.table) == len(self.model) and bool(self.table) == bool(self.model)
        assert dict(self.table.items()) == self.model and sorted(self.table.items()) == sorted(self.model.items())
        assert sorted(self.table) == sorted(self.table.keys()) == sorted(self.model) and dict(self.table) == self.model
        assert self.table == self.model and not self.table != self.model
        assert all(self.table[name] == block for name, block in self.model.items())


TestIndexMachine = needs_c(IndexMachine.TestCase)


@needs_c
def test_what_the_table_refuses_it_refuses_with_a_clear_error():
    table = NameIndex(2)
    with pytest.raises(ValueError, match="block id"):
        table[1] = -1
    with pytest.raises(TypeError):
        table.setdefault(1, "a block")
    with pytest.raises(TypeError):
        table[[1]] = 0  # unhashable, as a dict's key
    table["a name that is not an int"] = 3  # kept beside the table, as a dict would keep it
    assert table == {"a name that is not an int": 3} and table != {"another": 3} and (table == [1]) is False
    with pytest.raises(ValueError, match="num_blocks"):
        NameIndex(-1)


@needs_c
@pytest.mark.parametrize("key", [None, (1, 2), [1], 2**70])
@pytest.mark.parametrize("strays", [False, True])
def test_a_missing_or_unhashable_key_raises_as_a_dict_does(key, strays):
    """Before: KeyError() for None and KeyError(1, 2) for (1, 2), not the key as its one argument; and an unhashable
    key was merely absent (KeyError, False, None) while no stray name was kept, where a dict raises TypeError."""

    def outcomes(index):
        found = []
        for call in (lambda: index[key], lambda: index.__delitem__(key), lambda: key in index, lambda: index.get(key)):
            try:
                found.append(call())
            except (KeyError, TypeError) as error:
                found.append((type(error), error.args))
        return found

    made = {2**80: 1} if strays else {}
    assert outcomes(NameIndex(4, made.items())) == outcomes(made)


class _OddHash(int):
    def __hash__(self):
        return 12345


@needs_c
def test_an_int_of_its_own_hash_is_a_key_as_in_a_dict():
    """Before: an int subclass was kept by its value, so _OddHash(5) found 5, which a dict (hashing it to 12345) does
    not; a bool, hashed and compared as an int, still is its int."""

    def outcomes(index):
        index[5], index[_OddHash(7)] = 1, 2
        return [
            _OddHash(5) in index,
            index.get(_OddHash(5)),
            7 in index,
            _OddHash(7) in index,
            True in index,
            len(index),
        ]

    assert outcomes(NameIndex(4)) == outcomes({})


@needs_c
def test_a_name_given_twice_keeps_its_last_block_as_dict_of_pairs_does():
    """Before: NameIndex(n, pairs) kept a name's first block (setdefault), dict(pairs) keeps its last."""
    pairs = [(1, 2), (2**70, 3), (1, 4), (2**70, 5)]
    assert NameIndex(4, pairs) == dict(pairs)


class PoolMachine(RuleBasedStateMachine):
    """A pool on the table and one on a dict: the same calls, the same answers, the same state after each."""

    @initialize(keep=st.booleans())
    def make(self, keep):
        self.pools = [BlockPool("gpu", 8, keep), BlockPool("gpu", 8, keep)]
        self.pools[0].hash_to_block = NameIndex(8)  # whatever KVSCHED_DICT_INDEX says
        self.pools[1].hash_to_block = {}  # the reference: the dict and the Python loops
        self.held: list[int] = []

    def _each(self, call):
        results = [call(pool) for pool in self.pools]
        assert results[0] == results[1]
        return results[0]

    @rule(n=st.integers(1, 4))
    def allocate(self, n):
        if self.pools[0].num_free >= n:
            self.held += self._each(lambda pool: pool.allocate_many(n))

    @precondition(lambda self: self.held)
    @rule(data=st.data(), content=st.lists(st.integers(0, 5), min_size=1, max_size=4))
    def register(self, data, content):
        chosen = data.draw(st.lists(st.sampled_from(self.held), min_size=1, max_size=4, unique=True))
        hashes = [2**62 + 7 * c for c in content]
        self._each(lambda pool: pool.register(chosen, hashes))

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def take(self, data):
        """Another table holds a block too (a prefix hit, a fork): its count above 1, released one by one."""
        block = data.draw(st.sampled_from(self.held))
        self._each(lambda pool: pool.take(block))
        self.held.append(block)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def release(self, data):
        chosen = data.draw(st.lists(st.sampled_from(self.held), min_size=1, max_size=4, unique=True))
        for block in chosen:
            self.held.remove(block)
        self._each(lambda pool: pool.release_many(chosen))

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def forget_held(self, data):
        """An undone step forgets the names it gave."""
        named = [b for b in self.held if self.pools[0].block_hash[b] is not None]
        if named:
            chosen = data.draw(st.lists(st.sampled_from(named), min_size=1, max_size=3, unique=True))
            self._each(lambda pool: pool.forget(chosen))

    @rule(content=st.integers(0, 5))
    def look_up(self, content):
        self._each(lambda pool: pool.lookup(2**62 + 7 * content))

    @invariant()
    def same_state(self):
        one, other = self.pools
        assert one.hash_to_block == other.hash_to_block and one.block_hash == other.block_hash
        assert one._duplicates == other._duplicates and list(one.evictor) == list(other.evictor)
        assert (one._free, one.num_free, one.ref_counts, one.version) == (
            other._free,
            other.num_free,
            other.ref_counts,
            other.version,
        )
        holders = [self.held.count(b) for b in range(one.num_blocks)]
        assert one.audit(holders) == other.audit(holders) == []


TestPoolMachine = needs_c(PoolMachine.TestCase)


@needs_c
def test_a_name_whose_own_code_empties_the_pool_cannot_crash_the_loops():
    """A name the table cannot hold is a dict's key, whose __eq__ runs Python code: here it empties the pool's list
    of names under the loop, which then raises IndexError, as the Python loop would, and reads no freed memory."""
    from kvsched.allocators._nameindex import forget_names, register_names

    named: list = [None] * 4

    class Hostile:
        def __hash__(self):
            return 1

        def __eq__(self, other):
            named.clear()
            return False

    index, first, second = NameIndex(4), Hostile(), Hostile()
    assert register_names(index, named, [0], [first], False, {}) == [0] and named[0] is first
    with pytest.raises(IndexError):
        register_names(index, named, [1], [second], False, {})
    index[second] = 1
    named[:] = [second, None, None, None]  # its deletion compares it with the first: the list is emptied mid-loop
    with pytest.raises(IndexError):
        forget_names(index, named, [0])


def _pools_on_either_index(num_blocks: int) -> list[BlockPool]:
    pools = [BlockPool("gpu", num_blocks), BlockPool("gpu", num_blocks)]
    pools[0].hash_to_block, pools[1].hash_to_block = NameIndex(num_blocks), {}
    return pools


@needs_c
@pytest.mark.parametrize("bad", [-1, 4, "1", 1.0, 2**70])
def test_a_bad_block_id_is_released_as_the_python_code_releases_it(bad):
    """The C path leaves an id it cannot read to the Python code, so the error (or the negative index's block) and
    the state after it are the same on both pools."""
    outcomes = []
    for pool in _pools_on_either_index(4):
        held = pool.allocate_many(3)
        pool.register(held[:2], [11, 12])
        try:
            pool.release_many([held[0], bad, held[1]])
            outcomes.append(None)
        except Exception as error:  # noqa: BLE001 (the type and message are compared)
            outcomes.append((type(error), str(error)))
        outcomes.append((pool.ref_counts, pool._free, list(pool.evictor), pool.num_free, pool.block_hash))
    assert outcomes[:2] == outcomes[2:]


class _Index:
    """A block id as numpy's ints are: an index, not an int."""

    def __init__(self, value: int):
        self.value = value

    def __index__(self) -> int:
        return self.value


@needs_c
@pytest.mark.parametrize(
    "bad, forget", [(4, False), (2**70, False), ("1", False), (-1, True), (4, True), (2**70, True), (_Index(2), True)]
)
def test_a_bad_block_id_is_named_and_forgotten_as_the_python_code_does(bad, forget):
    """Before: the C loops refused a negative id (the list's last block to Python), raised OverflowError for one past
    a C ssize_t (IndexError in Python) and TypeError for an int-like one that Python indexes with. (Naming a block -1
    or an int-like one is not compared: the table holds block ids, ints from 0, and refuses others by design.)"""
    outcomes = []
    for pool in _pools_on_either_index(4):
        held = pool.allocate_many(3)
        try:
            if forget:
                pool.register(held, [11, 12, 13])
                pool.forget([held[0], bad])
            else:
                outcomes.append(pool.register([held[0], bad, held[1]], [11, 12, 13]))
        except Exception as error:  # noqa: BLE001 (the type and message are compared)
            outcomes.append((type(error), str(error)))
        outcomes.append((dict(pool.hash_to_block), pool.block_hash, pool._duplicates))
    assert outcomes[: len(outcomes) // 2] == outcomes[len(outcomes) // 2 :]


@needs_c
@pytest.mark.parametrize("odd", [2**70, None, "name"])
def test_forgetting_leaves_the_first_name_it_cannot_read_in_place_to_the_loop_that_copes(odd):
    """forget_names reads int64 names in place and hands the rest, from the first other one, to the loop that copes
    with any name: a stray name (beyond int64, a str) is forgotten there, and an unnamed block's None raises KeyError
    there after the blocks before it were forgotten, as the Python loop does."""
    outcomes = []
    for pool in _pools_on_either_index(8):
        held = pool.allocate_many(6)
        pool.register(held, [11, 12, odd, 14, 15, 16] if odd is not None else [11, 12, 13, 14, 15, 16])
        if odd is None:
            pool.forget([held[2]])  # unnamed now: forgetting it again finds None
        try:
            pool.forget(held[:2] + [held[2]] + held[3:])
            outcomes.append(None)
        except Exception as error:  # noqa: BLE001 (the type and message are compared)
            outcomes.append((type(error), str(error)))
        outcomes.append((dict(pool.hash_to_block), pool.block_hash, pool.version))
    assert outcomes[:2] == outcomes[2:]
    assert outcomes[0] == ((KeyError, "None") if odd is None else None)


@needs_c
@pytest.mark.parametrize("keep", [False, True])
@pytest.mark.parametrize("odd", [12, 2**70, "name"])
def test_naming_leaves_the_first_name_it_cannot_read_in_place_to_the_loop_that_copes(keep, odd):
    """register_names reads int64 names in place and hands the rest, from the first stray name (beyond int64, a str)
    or, with duplicates kept, the first content already in another block (12 here), to the loop that copes with
    any: the same blocks named, the same duplicates, as the Python loop."""
    outcomes = []
    for pool in _pools_on_either_index(8):
        pool.keep_duplicates = keep
        held = pool.allocate_many(6)
        pool.register(held[:1], [12])  # a named block is passed over; its content taken
        outcomes.append(pool.register(held, [12, 11, odd, 13, 12, 14]))
        outcomes.append((dict(pool.hash_to_block), pool.block_hash, pool._duplicates, pool.version))
    assert outcomes[:2] == outcomes[2:]
    duplicates = (2, 4) if odd == 12 else (4,)
    assert outcomes[0] == [b for k, b in enumerate(held) if k and (keep or k not in duplicates)]


@needs_c
def test_the_c_loops_leave_what_they_cannot_read_to_the_python_code():
    from kvsched.allocators._nameindex import hold_refs, release_refs

    counts = [0, 0, 0]
    assert hold_refs(counts, [0, 3]) is False and hold_refs(counts, [2, -1]) is False and counts == [0, 0, 0]
    assert hold_refs(counts, [2, 0]) is True and counts == [1, 0, 1]

    counts, named = [1, 2, 1, 1], [None, 5, 6, None]
    assert release_refs(counts, named, [0, 2, 9]) is None and release_refs(counts, named, [0, "2"]) is None
    assert release_refs([1, 2**70], named, [1, 0]) is None and counts == [1, 2, 1, 1]
    assert release_refs(counts, named, [3, 2, 0]) == ([3, 2, 0], 2, -1) and counts == [0, 2, 0, 0]
    assert release_refs(counts, named, [1, 1, 2]) == ([1], 0, 2) and counts == [0, 0, 0, 0]


@needs_c
def test_holding_leaves_a_count_that_is_not_an_int_to_the_python_loop():
    """Before: hold_refs replaced such a count in place and freed it, its own code running under the C loop, which
    reads the lists in place (a __del__ emptying them: memory read past their end). Now nothing runs, it is refused."""
    from kvsched.allocators._nameindex import hold_refs

    freed = []

    class Count(int):
        def __del__(self):
            freed.append(self)

    counts = [Count(0), 0]
    assert hold_refs(counts, [1, 0]) is False and counts == [0, 0] and not freed


@needs_c
def test_a_count_below_zero_is_a_double_free_on_either_index():
    """Before: the C loop took one from int64's least, a signed overflow (undefined; in practice its largest, the
    block held by 2**63 - 1 tables and no double free raised)."""
    for pool in _pools_on_either_index(4):
        block = pool.allocate()
        pool.ref_counts[block] = -(2**63)
        with pytest.raises(RuntimeError, match="double free"):
            pool.release_many([block])
        assert pool.ref_counts[block] == -(2**63)


@needs_c
@pytest.mark.parametrize("named", [False, True])
def test_a_block_given_twice_to_release_many_is_a_double_free_on_either_index(named):
    """Before: with its count 1, both loops took the block's two releases as its only holder's and freed it twice
    (free, or cached, twice; the free count one too many), where two calls of release raise at the second."""
    for pool in _pools_on_either_index(4):
        held = pool.allocate_many(2)
        if named:
            pool.register(held, [11, 12])
        with pytest.raises(RuntimeError, match=f"double free of gpu block {held[0]}"):
            pool.release_many([held[0], held[0], held[1]])
        holders = [int(block == held[1]) for block in range(4)]  # the second never released
        assert pool.ref_counts == holders and pool.num_free == 3 and pool.audit(holders) == []


class _Appending:
    """A stray name whose hash, the first time it is taken, appends items to lists (those a loop goes over)."""

    def __init__(self, appends):
        self.appends = appends

    def __hash__(self):
        for items, item in self.appends:
            items.append(item)
        self.appends = []
        return 1


@needs_c
def test_a_block_appended_under_the_loops_by_a_names_own_code_is_named_and_forgotten_as_in_python():
    """Before: what register_plain and forget_plain left was gone over from copies (tuples) made before, so a block
    a stray name's own code appended to the list given was missed, where the Python loop's iterators read it."""
    for pool in _pools_on_either_index(4):
        held = pool.allocate_many(3)
        blocks, hashes = held[:2], []
        hashes += [_Appending([(blocks, held[2]), (hashes, 13)]), 12]
        assert pool.register(blocks, hashes) == held and pool.block_hash[held[2]] == 13
        blocks = held[:2]
        pool.block_hash[held[0]].appends = [(blocks, held[2])]
        pool.forget(blocks)
        assert pool.block_hash == [None] * 4 and len(pool.hash_to_block) == 0


@needs_c
def test_the_pools_own_names_given_as_the_blocks_to_forget_are_read_as_python_reads_them():
    """Given that very list (each name a block id here), Python reads the block it has just unnamed as None and
    raises TypeError. Before: the blocks were read from a copy made first, so the C loop went on to forget block 0
    too. (forget_plain, which reads the blocks in place, must not have it: it would take that None for a block id.)"""
    outcomes = []
    for pool in _pools_on_either_index(2):
        pool.allocate_many(2)
        pool.register([0, 1], [1, 0])  # block 0 named 1, block 1 named 0
        try:
            pool.forget(pool.block_hash)
        except TypeError as error:
            outcomes.append(str(error))
        outcomes.append((dict(pool.hash_to_block), pool.block_hash))
    assert outcomes[:2] == outcomes[2:] and outcomes[1] == ({1: 0}, [1, None])


parents = st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from([ROOT, -1, -2, 2**61 - 1, -(2**61), 2**64]))


@needs_c
@given(
    parent=parents,
    block=st.sampled_from([1, 3, 16, 512]),
    size=st.sampled_from([1, 2, 5, 16]),
    ids=st.lists(st.one_of(st.integers(0, 2**40), st.just(-1)), min_size=1, max_size=20),
    named=st.integers(0, 3),
    n=st.integers(0, 40),
)
def test_blocks_inside_a_prompts_blocks_are_named_in_c_as_the_python_loop_names_them(
    parent, block, size, ids, named, n
):
    """name_inside's own hash of a pair (CPython's tuple hash, written out) against ``hash((parent, first))``, from
    int64's extremes to a name past them (the root), up to the first block that spans two (-1: the largest id)."""
    from kvsched.allocators._nameindex import name_inside

    ids = tuple((2**63 - 1) // block - 1 if i < 0 else i for i in ids)
    n = min(n, len(ids) * block // size)
    hashes, expected = [0] * named, [0] * named
    name_inside(hashes, parent, ids, block, size, n)
    name = parent
    for j in range(named, n):
        q = j * size // block
        if (j + 1) * size > (q + 1) * block:
            break
        name = hash((name, ids[q] * block - q * block + j * size))
        expected.append(name)
    assert hashes == expected


@needs_c
def test_name_inside_refuses_what_it_cannot_name():
    from kvsched.allocators._nameindex import name_inside

    for ids, block, size in (((1,), 0, 16), ((1,), 16, 0), ((-1,), 16, 16), ((2**62,), 16, 16)):
        with pytest.raises(ValueError, match="name_inside"):
            name_inside([], ROOT, ids, block, size, 1)


@needs_c
@pytest.mark.parametrize("block_size, n", [(4, 20), (16, 4), (3, 17)])
def test_naming_blocks_past_a_prompts_end_fails_as_the_python_loop_does(monkeypatch, block_size, n):
    """Before: name_inside raised ValueError for a block past the prompt's last, the Python loop IndexError."""
    outcomes = []
    for loop in (block_prompt.name_inside, None):
        monkeypatch.setattr(block_prompt, "name_inside", loop)
        names = []
        with pytest.raises(IndexError) as error:
            BlockPrompt((3, 5, 7), 40, 16).name_blocks(names, block_size, n)
        outcomes.append((str(error.value), names))
    assert outcomes[0] == outcomes[1]


@needs_c
def test_blocks_of_over_2_to_the_31_tokens_are_left_to_the_python_loop(monkeypatch):
    """name_inside's sums of block sizes are long longs: such blocks are named in Python, alike."""
    from kvsched.allocators._nameindex import name_inside

    names = []
    assert name_inside(names, ROOT, (0, 0), 2**62, 2**61, 3) is None and names == []
    outcomes = []
    for loop in (block_prompt.name_inside, None):
        monkeypatch.setattr(block_prompt, "name_inside", loop)
        names = []
        BlockPrompt((0, 0), 2**62 + 1, 2**62).name_blocks(names, 2**61, 3)
        outcomes.append(names)
    assert outcomes[0] == outcomes[1] and len(outcomes[0]) == 3


def _in_c_and_in_python(module, loop: str, call):
    """``call()`` with the module's C loop, then with its Python loop (the name set to None, as without the build):
    the two answers, an exception's type for its answer."""
    answers, saved = [], getattr(module, loop)
    for c_loop in (saved, None):
        setattr(module, loop, c_loop)
        try:
            answers.append(call())
        except Exception as error:  # noqa: BLE001 (compared)
            answers.append(type(error))
        finally:
            setattr(module, loop, saved)
    return answers


@needs_c
@given(
    ids=st.lists(st.integers(0, 2**40), min_size=1, max_size=12),
    block=st.sampled_from([16, 32, 512]),
    block_size=st.sampled_from([4, 16, 48, 100]),
    cut=st.integers(0, 15),
    steps=st.lists(st.integers(1, 40), min_size=1, max_size=4),
)
def test_a_prompt_as_blocks_is_named_alike_with_and_without_the_c_loop(ids, block, block_size, cut, steps):
    prompt = BlockPrompt(ids, max(1, len(ids) * block - cut), block)

    def named():
        hashes: list[int] = []
        for n in steps:  # a few blocks at a time, as the block manager asks
            prompt.name_blocks(hashes, block_size, min(len(hashes) + n, len(prompt) // block_size))
        return hashes

    in_c, in_python = _in_c_and_in_python(block_prompt, "name_inside", named)
    assert in_c == in_python and type(in_c) is list


@needs_c
@given(counts=st.lists(st.integers(0, 3), min_size=1, max_size=12), data=st.data())
def test_the_held_hits_are_counted_in_c_as_in_python(counts, data):
    blocks = data.draw(st.lists(st.integers(-len(counts), len(counts) + 1), max_size=12))
    in_c, in_python = _in_c_and_in_python(block_manager, "count_held", lambda: block_manager._num_held(counts, blocks))
    assert in_c == in_python
