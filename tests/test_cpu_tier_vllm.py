"""kvsched's CPU KV tier against vLLM 0.34's own (``vllm/v1/kv_offload/cpu/manager.py`` with its LRU and ARC
policies), operation by operation: the same stores, lookups, loads, completions and finishes, driven in both, must
store the same keys in the same CPU slots, evict the same keys in the same order, find the same hits and leave the
same chunks with the same ref counts (and, under ARC, the same T1, T2, ghosts and target).

It runs where vLLM 0.34 is installed (``make test-vllm-matrix``'s 0.34 venv) and skips elsewhere; the tier's
properties that need no vLLM are tests/test_cpu_tier.py's."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("vllm", reason="vLLM is not installed; make test-vllm-matrix builds the 0.34 venv")
from vllm_release import RELEASE, RELEASE_KEY  # noqa: E402

if RELEASE_KEY < (0, 34):
    pytest.skip(f"the native CPU offloading manager checked here is vLLM 0.34's (here {RELEASE})", allow_module_level=True)

from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key  # noqa: E402
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager  # noqa: E402

from kvsched.allocators.cpu_tier import CpuTier  # noqa: E402


def _vkey(key: int):
    return make_offload_key(key.to_bytes(8, "big"), 0)


class Both:
    """The same CPU tier twice: kvsched's, and vLLM's manager, with one ``ReqContext`` per live request."""

    def __init__(self, blocks: int, policy: str) -> None:
        self.ours = CpuTier(blocks, policy)
        self.theirs = CPUOffloadingManager(num_chunks=blocks, cache_policy=policy)
        self.contexts: dict[str, ReqContext] = {}
        self.pending_stores: list[tuple[str, list[int]]] = []
        self.pending_loads: list[tuple[str, list[int]]] = []

    def context(self, request: str, keys: list[int]) -> ReqContext:
        if request not in self.contexts:
            self.contexts[request] = ReqContext(req_id=request)
            self.theirs.on_new_request(self.contexts[request])
        ctx = self.contexts[request]
        for i, key in enumerate(keys):  # the position vLLM's scheduler records: the block's end token (16 a block)
            ctx.set_offload_key_position(_vkey(key), 16 * (i + 1))
        return ctx

    def store(self, request: str, keys: list[int], start: int) -> None:
        ctx = self.context(request, keys)
        offered = keys[start:]
        ours = self.ours.prepare_store(request, offered, start)
        theirs = self.theirs.prepare_store([_vkey(k) for k in offered], ctx)
        assert (ours is None) == (theirs is None), f"store of {offered}: kvsched {ours}, vLLM {theirs}"
        if ours is None:
            return
        stored, evicted = ours
        assert [_vkey(k) for k in stored] == list(theirs.keys_to_store)
        assert [_vkey(k) for k in evicted] == list(theirs.evicted_keys)
        assert [self.ours.slot[k] for k in stored] == list(theirs.store_spec.block_ids)
        self.pending_stores.append((request, stored))

    def lookup(self, request: str, keys: list[int], start: int) -> int:
        ctx = self.context(request, keys)
        theirs = 0
        for key in keys[start:]:
            if self.theirs.lookup(_vkey(key), ctx) is LookupResult.MISS:
                break
            theirs += 1
        ours = self.ours.lookup(keys[start:])
        assert ours == theirs, f"lookup of {keys[start:]}: kvsched {ours}, vLLM {theirs}"
        return ours

    def load(self, request: str, keys: list[int], start: int) -> None:
        run = []
        for key in keys[start:start + self.lookup(request, keys, start)]:
            if not self.ours.is_ready(key):
                break
            run.append(key)
        if not run:
            return
        slots = self.ours.prepare_load(request, run, start)
        spec = self.theirs.prepare_load([_vkey(k) for k in run], self.contexts[request])
        assert slots == list(spec.block_ids)
        self.pending_loads.append((request, run))

    def complete(self) -> None:
        for request, keys in self.pending_stores:
            self.ours.complete_store(keys)
            self.theirs.complete_store([_vkey(k) for k in keys], self.contexts[request])
        for request, keys in self.pending_loads:
            self.ours.complete_load(keys)
            self.theirs.complete_load([_vkey(k) for k in keys], self.contexts[request])
        self.pending_stores.clear()
        self.pending_loads.clear()

    def finish(self, request: str) -> None:
        if request in self.contexts and not any(r == request for r, _ in self.pending_stores + self.pending_loads):
            self.ours.finish(request)
            self.theirs.on_request_finished(self.contexts.pop(request))

    def check(self, universe: set[int]) -> None:
        """The same chunks, each with the same ref count; under ARC, the same lists in the same order."""
        for key in universe:
            chunk = self.theirs._policy.get(_vkey(key))
            ours = self.ours.ref_counts.get(key)
            assert (None if chunk is None else chunk.ref_cnt) == ours, f"key {key}: kvsched {ours}, vLLM {chunk}"
        assert self.ours.audit() == []
        if self.ours.policy_name == "arc":
            p, q = self.theirs._policy, self.ours.policy
            for name in ("t1", "t2", "b1", "b2"):
                assert [_vkey(k) for k in getattr(q, name)] == list(getattr(p, name)), name
            assert q.target == p.target_t1_size


def _requests(draw, n: int) -> list[list[int]]:
    """``n`` requests' block keys, with shared prefixes (a key is its prefix of symbols, as a block hash is)."""
    out = []
    for _ in range(n):
        symbols = draw(st.lists(st.integers(0, 2), min_size=1, max_size=8))
        out.append([hash(tuple(symbols[: i + 1])) & (2**63 - 1) for i in range(len(symbols))])
    return out


@settings(deadline=None)
@given(data=st.data(), policy=st.sampled_from(["lru", "arc"]), blocks=st.integers(1, 8))
def test_the_cpu_tier_stores_evicts_and_loads_as_vllm_0_34s_manager(data, policy, blocks):
    both = Both(blocks, policy)
    requests = _requests(data.draw, data.draw(st.integers(1, 5)))
    universe = {k for keys in requests for k in keys}
    live = [f"r{i}" for i in range(len(requests))]
    for _ in range(data.draw(st.integers(1, 40))):
        i = data.draw(st.integers(0, len(requests) - 1))
        request, keys = live[i], requests[i]
        op = data.draw(st.sampled_from(["store", "store", "lookup", "load", "complete", "complete", "finish"]))
        start = data.draw(st.integers(0, len(keys) - 1))
        if op == "store":
            both.store(request, keys, start)
        elif op == "lookup":
            both.lookup(request, keys, start)
        elif op == "load":
            both.load(request, keys, start)
        elif op == "complete":
            both.complete()
        elif request in both.contexts and not any(r == request for r, _ in both.pending_stores + both.pending_loads):
            both.finish(request)
            live[i] = request + "+"  # the same prompt again, as a new request
        both.check(universe)
    both.complete()
    both.check(universe)
