"""Prompts given as blocks (allocators/block_prompt.py, issue 35 item 1): a ``BlockPrompt`` reads as the tuple of
its token ids, its blocks are named as equal exactly when their tokens are, a run of the engine gives the same
results with the prompts as blocks as with their tokens, and a queued prompt costs its ids, not its tokens."""

from __future__ import annotations

import pickle
import tracemalloc
from itertools import islice

import pyarrow.compute as pc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvsched.allocators.block_pool import BlockPool, OutOfBlocks
from kvsched.allocators.block_prompt import ROOT, BlockPrompt, chain_hashes
from kvsched.cluster import Cluster, FleetSpec, ReplicaGroup
from kvsched.core.config import EngineConfig
from kvsched.core.request import Request
from kvsched.experiments.simulation import run_simulation
from kvsched.workloads.distributions import LogNormal
from kvsched.workloads.long_context import LongContextSpec


def tokens_of(ids: list[int], length: int, block: int) -> tuple[int, ...]:
    """The trace's rule, written out: block ``h`` is ``h * block .. h * block + block - 1``, cut to the length."""
    return tuple(h * block + j for h in ids for j in range(block))[:length]


def names_of(tokens: tuple[int, ...], block_size: int) -> list[int]:
    """The block manager's naming before prompts as blocks: the chained hash of each full block's token ids."""
    names, parent = [], ROOT
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash((parent, tokens[start : start + block_size]))
        names.append(parent)
    return names


BLOCKS = st.sampled_from([1, 2, 3, 4, 7, 16])


@st.composite
def block_prompts(draw, block: int | None = None):
    """Ids from a few, so that prompts share blocks and ids follow each other (runs that cross a block)."""
    block = block or draw(BLOCKS)
    length = draw(st.integers(1, 6 * block))
    return BlockPrompt(
        draw(st.lists(st.integers(0, 5), min_size=-(-length // block), max_size=-(-length // block))), length, block
    )


@given(block_prompts(), st.data())
def test_a_prompt_as_blocks_reads_as_its_token_ids(prompt, data):
    tokens = tokens_of(list(prompt.hash_ids), prompt.length, prompt.block)
    assert tuple(prompt) == tokens and len(prompt) == len(tokens) and list(iter(prompt)) == list(tokens)
    assert prompt == tokens and tokens == prompt and hash(prompt) == hash(tokens) and prompt != tokens[:-1]
    index = data.draw(st.integers(-len(tokens), len(tokens) - 1))
    assert prompt[index] == tokens[index]
    start, stop = (
        data.draw(st.integers(-len(tokens) - 2, len(tokens) + 2)),
        data.draw(st.integers(-len(tokens) - 2, len(tokens) + 2)),
    )
    step = data.draw(st.sampled_from([None, 1, 2, -1]))
    assert prompt[start:stop:step] == tokens[start:stop:step]
    assert pickle.loads(pickle.dumps(prompt)) == prompt and prompt + (9,) == tokens + (9,)
    with pytest.raises(IndexError):
        prompt[len(tokens)]


@pytest.mark.parametrize(
    "ids, length, block",
    [([], 1, 4), ([1, 2], 4, 4), ([1], 0, 4), ([-1], 3, 4), ([1], 3, 0), ([2**62], 3, 4), ([1.0], 3, 4)],
)
def test_a_bad_prompt_as_blocks_is_refused(ids, length, block):
    with pytest.raises(ValueError):
        BlockPrompt(ids, length, block)


@given(BLOCKS, st.sampled_from([1, 2, 3, 4, 5, 16]), st.data())
def test_blocks_are_named_alike_exactly_when_their_tokens_are_equal(block, block_size, data):
    """Equal names, equal tokens, across prompts with the same hash block size: the prefix hits of the tokens."""
    prompts = data.draw(st.lists(block_prompts(block), min_size=1, max_size=4))
    named = [chain_hashes([], p, block_size, 10**9) for p in prompts]
    by_tokens = [names_of(tuple(p), block_size) for p in prompts]
    ours = [a == b for x in named for y in named for a in x for b in y]
    assert ours == [a == b for x in by_tokens for y in by_tokens for a in x for b in y]
    assert [len(x) for x in named] == [len(x) for x in by_tokens]
    grown: list[int] = []  # named a few blocks at a time, as the block manager asks
    while len(grown) < len(named[0]):
        chain_hashes(grown, prompts[0], block_size, len(grown) + data.draw(st.integers(1, 5)))
    assert grown == named[0]


@given(st.lists(st.integers(0, 3), max_size=40), st.sampled_from([1, 2, 4, 16]))
def test_token_ids_are_named_as_the_block_manager_always_named_them(tokens, block_size):
    assert chain_hashes([], tuple(tokens), block_size, 10**9) == names_of(tuple(tokens), block_size)


def test_a_request_keeps_its_prompt_as_blocks():
    prompt = BlockPrompt([3, 1, 4], 1200, 512)
    request = Request(request_id="r", prompt_token_ids=prompt)
    assert request.prompt_token_ids is prompt and request.prompt_len == 1200
    assert request.model_dump()["prompt_token_ids"] == tuple(prompt)
    with pytest.raises(ValueError, match="disagrees"):
        Request(request_id="r", prompt_token_ids=prompt, prompt_len=1000)


def small_sessions(sessions: int = 40) -> LongContextSpec:
    """Long-context sessions shrunk to fit a small pool: prompts of a few hundred to a few thousand tokens on
    64-token hash blocks (engine blocks of 16 lie four to a hash block; 24 cross one, as 40 would not divide)."""
    return LongContextSpec(
        num_sessions=sessions,
        rate=4.0,
        think_time_s=5.0,
        system_blocks=3,
        block_size=64,
        context=LogNormal(median=300, sigma=0.8, max=3_000),
        turn=LogNormal(median=200, sigma=0.8, max=2_000),
        output=LogNormal(median=20, sigma=0.5, max=200),
        max_context=4_096,
    )


def as_tokens(requests: list[Request]) -> list[Request]:
    return [r.model_copy(update={"prompt_token_ids": tuple(r.prompt_token_ids)}) for r in requests]


@pytest.mark.parametrize("block_size", [16, 24])
def test_a_run_with_prompts_as_blocks_is_the_run_with_their_tokens(block_size):
    """Same steps, same prefix hits, same times: a pool of 4,800 tokens (the cache evicts all along) with V1's
    mechanics and with v0's."""
    requests = small_sessions().requests()
    assert all(type(r.prompt_token_ids) is BlockPrompt for r in requests)
    asked = sum(r.prompt_len + r.output_len for r in requests)
    for policy in ("vllm-v1", "vllm-default"):
        config = EngineConfig(
            enable_prefix_caching=True,
            block_size=block_size,
            num_gpu_blocks=4_800 // block_size,
            max_model_len=4_096,
            max_num_batched_tokens=4_096,
        )
        blocks, tokens = (run_simulation(rs, policy, config) for rs in (requests, as_tokens(requests)))
        assert [r.as_dict() for r in blocks.requests] == [r.as_dict() for r in tokens.requests]
        assert blocks.summary == tokens.summary and blocks.summary["recompute"]["computed_tokens"] < 0.8 * asked  # hits


@pytest.mark.parametrize("router", ["precise-prefix", "cache-aware"])
def test_a_prefix_aware_fleet_routes_prompts_as_blocks_as_it_routes_their_tokens(router):
    requests = small_sessions(30).requests()
    fleet = FleetSpec(
        replicas=[
            ReplicaGroup(count=3, policy="vllm-v1", settings={"enable_prefix_caching": True, "max_model_len": 4_096})
        ],
        router=router,
    )
    runs = []
    for rs in (requests, as_tokens(requests)):
        cluster = Cluster(fleet)
        cluster.run(iter(rs))
        runs.append((cluster.records.rows, cluster.records.routes))  # a row holds its replica and cached tokens
    table = cluster.records.table
    assert (
        runs[0] == runs[1]
        and pc.sum(table["cached_tokens"]).as_py() > 0
        and pc.count_distinct(table["replica"]).as_py() == 3
    )


def test_a_queued_long_prompt_costs_its_ids_not_its_tokens():
    """2,000 of the long-context hour's requests (a mean prompt of about 12,000 tokens) held at once: under 4 kB
    each. Their token ids as Python ints took about 36 bytes a token, some 400 kB a request."""
    made = LongContextSpec().iter_requests()
    next(made)
    tracemalloc.start()
    try:
        held = list(islice(made, 2_000))
        size, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert sum(r.prompt_len for r in held) / len(held) > 8_000
    assert size / len(held) < 4_000, f"{size / len(held):,.0f} bytes a request"


@given(st.lists(st.tuples(st.sampled_from(["allocate", "release", "register"]), st.integers(1, 6)), max_size=30))
def test_the_pools_calls_on_many_blocks_are_its_calls_one_at_a_time(ops):
    """allocate_many past the free list, register and release_many of a list: the blocks, names and order of one
    block at a time (a second pool that does each op block by block)."""
    many, one = BlockPool("gpu", 12, keep_duplicates=True), BlockPool("gpu", 12, keep_duplicates=True)
    held: list[list[int]] = []
    for k, (op, n) in enumerate(ops):
        if op == "allocate":
            if many.num_free < n:
                with pytest.raises(OutOfBlocks):
                    many.allocate_many(n)
                continue
            blocks = many.allocate_many(n)
            assert blocks == [one.allocate() for _ in range(n)]
            held.append(blocks)
        elif op == "register" and held:
            blocks = held[n % len(held)]
            names = [(k + i) % 3 for i in range(len(blocks))]  # repeats: duplicates and blocks already named
            assert many.register(blocks, names) == [b for b, h in zip(blocks, names) if one.register([b], [h])]
        elif op == "release" and held:
            blocks = held.pop(n % len(held))
            many.release_many(blocks[::-1])
            for b in blocks[::-1]:
                one.release(b)
        assert (
            many.hash_to_block,
            many.block_hash,
            many._duplicates,
            list(many.evictor),
            many._free,
            many.num_free,
        ) == (one.hash_to_block, one.block_hash, one._duplicates, list(one.evictor), one._free, one.num_free)
        assert many.audit([sum(b in t for t in held) for b in range(12)]) == []
