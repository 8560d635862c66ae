"""kvsched's CPU KV tier against vLLM 0.34's own (``vllm/v1/kv_offload/cpu/manager.py`` with its LRU and ARC
policies), operation by operation: the same stores, lookups, loads, completions and finishes, driven in both, must
store the same keys in the same CPU slots, evict the same keys in the same order, find the same hits and leave the
same chunks with the same ref counts (and, under ARC, the same T1, T2, ghosts and target).

It runs where vLLM 0.34 is installed (``make test-vllm-matrix``'s 0.34 venv) and skips elsewhere; the tier's
properties that need no vLLM are tests/test_cpu_tier.py's."""

from __future__ import annotations

import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st
from vllm_release import RELEASE, RELEASE_KEY

# The release is read from the package metadata before vLLM is imported: importing it imports Triton, and a
# module collected before tests/kernel_cases.py must not (Triton decides at import whether kernels are interpreted).
if RELEASE is None:
    pytest.skip("vLLM is not installed; make test-vllm-matrix builds the 0.34 venv", allow_module_level=True)
if RELEASE_KEY < (0, 34):
    pytest.skip(
        f"the native CPU offloading manager checked here is vLLM 0.34's (here {RELEASE})", allow_module_level=True
    )

from test_vllm_v1_differential import SameTokens  # noqa: E402
from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key  # noqa: E402
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager  # noqa: E402

from kvsched import Engine, EngineConfig, Request, SamplingParams  # noqa: E402
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
        for key in keys[start : start + self.lookup(request, keys, start)]:
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


class _InFinishOrder(dict):
    """The ids of the requests that finished since the last step, in the order they finished: the set vLLM keeps
    them in (``Scheduler.finished_req_ids``) iterates in an order of their string hashes, which Python draws anew
    for each process, and the connector stores a step's finished requests in that order (which then decides what
    its LRU evicts first). kvsched stores them as they finish, one of the orders vLLM may take."""

    def add(self, request_id: str) -> None:
        self[request_id] = None

    def discard(self, request_id: str) -> None:
        self.pop(request_id, None)


class OffloadingReference:
    """vLLM 0.34's ``Scheduler`` with the ``OffloadingConnector`` (its native CPU tier) and a fake worker that
    finishes every transfer within the step that issued it; what each step stored and loaded, per request. The
    requests finished in a step reach the connector in the order they finished (``_InFinishOrder``)."""

    def __init__(self, cpu_blocks: int, policy: str, **config) -> None:
        from vllm.config import KVTransferConfig
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingWorkerMetadata
        from vllm.v1.outputs import KVConnectorOutput
        from vllm_v1_reference import V1Reference

        transfer = KVTransferConfig(
            kv_connector="OffloadingConnector",
            kv_role="kv_both",
            kv_connector_extra_config={"cpu_bytes_to_use": cpu_blocks * 4096, "eviction_policy": policy},
        )  # a block of the test's model: 4 KiB
        self.vllm = V1Reference(**config, kv_transfer_config=transfer)
        self.stores: list[tuple[str, int]] = []
        self.loads: list[tuple[str, int]] = []
        update = self.vllm.scheduler.update_from_output

        def answered(out, runner):
            meta = out.kv_connector_metadata
            self.stores = [(job.req_id, len(job.dst_spec.block_ids)) for job in meta.store_jobs.values()]
            self.loads = [(job.req_id, len(job.dst_spec.block_ids)) for job in meta.load_jobs.values()]
            done = {j: 1 for j in (*meta.load_jobs, *meta.store_jobs)}
            runner.kv_connector_output = KVConnectorOutput(
                finished_recving={job.req_id for job in meta.load_jobs.values()},
                kv_connector_worker_meta=OffloadingWorkerMetadata(completed_jobs=done) if done else None,
            )
            scheduler.finished_req_ids = _InFinishOrder.fromkeys(scheduler.finished_req_ids)  # emptied by schedule()
            return update(out, runner)

        scheduler = self.vllm.scheduler
        scheduler.update_from_output = answered


@st.composite
def offloading_scenarios(draw):
    # every request fits alone (10 blocks of 4 and the null block): one that cannot is a known difference, out of scope
    config = dict(
        block_size=4,
        num_gpu_blocks=draw(st.integers(11, 20)),
        max_num_batched_tokens=draw(st.sampled_from([16, 32])),
        max_num_seqs=draw(st.integers(1, 4)),
        max_model_len=40,
        enable_prefix_caching=True,
    )
    prefixes = [[1000 * p + i for i in range(draw(st.integers(8, 24)))] for p in range(draw(st.integers(1, 3)))]
    requests = []
    for i in range(draw(st.integers(1, 8))):
        prompt = prefixes[draw(st.integers(0, len(prefixes) - 1))] + [
            50_000 + 100 * i + j for j in range(draw(st.integers(1, 8)))
        ]
        requests.append(
            dict(rid=f"r{i}", prompt=prompt[:32], max_tokens=draw(st.integers(1, 6)), step=draw(st.integers(0, 30)))
        )
    return config, draw(st.integers(1, 16)), draw(st.sampled_from(["lru", "arc"])), requests


def run_both(
    config: dict, cpu_blocks: int, policy: str, requests: list[dict], events: bool = False
) -> list[tuple[str, int]]:
    """Both schedulers, the same requests at the same steps: every step must schedule the same tokens and store the
    same number of blocks for the same requests, until the first load from the CPU, which must be the same request
    loading as many blocks (returned; none if the run ends first). From there vLLM spends a step on the load (the
    request holds its blocks and runs a step later) where kvsched loads and computes in one step: the timing is
    modelled (docs/simulation.md), not mirrored, and a request admitted after it in that step may already differ."""
    theirs = OffloadingReference(cpu_blocks, policy, **config)
    ours = Engine(
        EngineConfig(
            **config,
            vllm_engine="v1",
            kv_offloading_blocks=cpu_blocks,
            kv_offloading_policy=policy,
            audit_every_step=True,
        ),
        "vllm-v1",
        SameTokens(),
        policy_options={"policy": "fcfs", "vllm_release": RELEASE},
    )
    tier, stored, loaded = ours.scheduler.offloading.tier, [], []
    prepare_store, prepare_load = tier.prepare_store, tier.prepare_load

    def store(request, keys, first):
        result = prepare_store(request, keys, first)
        if result is not None and result[0]:
            stored.append((request, len(result[0])))
        return result

    def load(request, keys, first):
        loaded.append((request, len(keys)))
        return prepare_load(request, keys, first)

    tier.prepare_store, tier.prepare_load = store, load
    for k in range(400):
        for r in requests:
            if r["step"] == k:
                ours.add_request(
                    Request(
                        request_id=r["rid"],
                        prompt_token_ids=tuple(r["prompt"]),
                        arrival_time=float(k),
                        sampling=SamplingParams(max_tokens=r["max_tokens"], ignore_eos=True),
                    )
                )
                theirs.vllm.add(r["rid"], r["prompt"], r["max_tokens"], arrival_time=float(k))
        if k > max(r["step"] for r in requests) and not ours.has_unfinished() and not theirs.vllm.has_unfinished():
            return []
        stored.clear(), loaded.clear()
        report, step = ours.step(), theirs.vllm.step()
        if loaded or theirs.loads:
            # The first request to load: kvsched computes its tokens in this step too (vLLM in the next), so the
            # blocks it takes may evict what a request admitted after it would find on the GPU in vLLM.
            assert loaded[:1] == theirs.loads[:1], f"step {k}: kvsched loads {loaded}, vLLM {theirs.loads}"
            return loaded[:1]
        mine = {sg.group.request_id: sg.num_tokens for sg in report.output.scheduled}
        assert mine == step.scheduled, f"step {k}: kvsched schedules {mine}, vLLM {step.scheduled}"
        assert stored == theirs.stores, f"step {k}: kvsched stores {stored}, vLLM {theirs.stores}"
        if stored and events:
            event("blocks stored")
    raise AssertionError("not finished after 400 steps")


# 10 blocks of 4 tokens and the null block, two requests at once: a prefix cached on the GPU is soon evicted.
SMALL = dict(
    block_size=4,
    num_gpu_blocks=11,
    max_num_batched_tokens=16,
    max_num_seqs=2,
    max_model_len=40,
    enable_prefix_caching=True,
)


@settings(deadline=None)
@given(offloading_scenarios())
@example(  # r4 loads one block and computes at once, taking the GPU blocks r0's prefix was cached in; vLLM waits
    (
        SMALL,
        9,
        "lru",
        [
            dict(rid="r0", prompt=[*range(2000, 2010), 50000, 50001], max_tokens=1, step=5),
            dict(rid="r1", prompt=[*range(1000, 1013), 50100], max_tokens=1, step=0),
            dict(rid="r2", prompt=[*range(15), 50200], max_tokens=2, step=2),
            dict(rid="r3", prompt=[*range(2000, 2010), 50300], max_tokens=2, step=0),
            dict(rid="r4", prompt=[*range(1000, 1013), *range(50400, 50408)], max_tokens=1, step=4),
        ],
    )
)
def test_the_cpu_tier_stores_what_vllm_0_34s_offloading_connector_stores_step_by_step(scenario):
    if run_both(*scenario, events=True):
        event("a request loads from the CPU tier")


def test_a_prefix_evicted_from_the_gpu_is_loaded_from_the_cpu_as_vllm_0_34_loads_it():
    """A's 13 tokens are stored (3 full blocks), B's 36 evict two of A's cached GPU blocks, C (A's first 12 tokens and
    2 more) finds the first block in the GPU and the other two on the CPU: both load those 2 in the same step."""
    config = SMALL
    a = list(range(100, 113))
    requests = [
        dict(rid="A", prompt=a, max_tokens=2, step=0),
        dict(rid="B", prompt=list(range(200, 236)), max_tokens=1, step=4),
        dict(rid="C", prompt=a[:12] + [5, 6], max_tokens=1, step=12),
    ]
    for policy in ("lru", "arc"):
        assert run_both(config, 16, policy, requests) == [("C", 2)]
