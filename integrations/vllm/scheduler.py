"""``KvschedScheduler``: vLLM V1's scheduler class, with every decision taken by an installed kvsched policy.

Give it to vLLM as ``--scheduler-cls kvsched.integrations.vllm.scheduler.KvschedScheduler`` (or
``scheduler_cls=`` in Python), with the policy in the additional config::

    --additional-config '{"kvsched": {"policy": "priority-vip", "options": {"aging_s": 2}}}'

It runs in vLLM's engine-core process. Each step the policy decides on the mirror (``mirror.py``):
kvsched's own core, with V1's mechanics, holding the same requests and the same KV cache; the
decision is replayed on vLLM's state (``realize.py``), where vLLM's KV-cache manager allocates
and its model runner executes. A policy that raises or decides something invalid gets a
``PolicyError`` and nothing of its step is applied: that step falls back to ``vllm-v1`` (vLLM's
own rule), the cause is logged once and counted (``faults.py``). Every other call from vLLM is
guarded too: a request the mirror refuses fails alone, a policy's ``on_step`` that raises is
counted, and a failure that leaves the mirror unlike vLLM's state gives the mirror up (vLLM's own
scheduler decides from then on), so nothing stops the engine core. docs/vllm-integration.md maps
each hook and operation onto vLLM.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason
from vllm.v1.request import RequestStatus

from kvsched.core.plugins import PolicyHooks
from kvsched.errors import KvschedError, PolicyError
from kvsched.integrations.vllm.faults import PolicyFaults
from kvsched.integrations.vllm.mirror import Mirror, mirror_config
from kvsched.integrations.vllm.realize import MirrorDrift, grammar_compiled, installed_release, realize
from kvsched.integrations.vllm.slots import SteadySlots
from kvsched.integrations.vllm.steplog import StepLogging

FALLBACK_POLICY = "kvsched:vllm-v1"  # kvsched's own, whatever other distribution registers a vllm-v1


def _pass_exits(exc: BaseException) -> None:
    """Re-raise what stops the process (vLLM shuts its engine core down with ``SystemExit``); anything
    else raised in a call from vLLM, a policy's own ``BaseException`` subclass included, is contained."""
    if isinstance(exc, (SystemExit, KeyboardInterrupt)):
        raise exc


def settings_of(vllm_config: Any) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """From ``additional_config["kvsched"]``: the policy (an installed name or ``file.py:Class``;
    default vllm-v1 with vLLM's own policy), its ``options``, and engine settings vLLM has no knob
    for (``config``, e.g. ``{"delay_factor": 0.5}``)."""
    extra = vllm_config.additional_config or {}
    kvsched = extra.get("kvsched", {}) if isinstance(extra, dict) else {}
    if not isinstance(kvsched, dict):
        raise KvschedError(f'additional_config "kvsched" must be an object, got {kvsched!r}')
    policy = kvsched.get("policy", FALLBACK_POLICY)
    options = dict(kvsched.get("options") or {})
    if policy in (FALLBACK_POLICY, "vllm-v1"):
        options = {**vllm_v1_options(vllm_config), **options}
    return policy, options, dict(kvsched.get("config") or {})


def vllm_v1_options(vllm_config: Any) -> dict[str, Any]:
    """``vllm-v1``'s options that mean what vLLM is configured with: its queue policy, long-prefill threshold and
    release."""
    sched = vllm_config.scheduler_config
    return {
        "policy": sched.policy,
        "long_prefill_token_threshold": sched.long_prefill_token_threshold,
        "vllm_release": installed_release(),
    }


class PolicyScheduler(Scheduler):
    """vLLM's ``Scheduler`` whose ``schedule()`` is a kvsched policy's step (see the module docstring); over
    ``AsyncScheduler`` (``KvschedAsyncScheduler``) the same code schedules with a step in flight."""

    def __init__(self, vllm_config: Any, kv_cache_config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(vllm_config, kv_cache_config, *args, **kwargs)
        self.in_flight = isinstance(self, AsyncScheduler)  # vLLM schedules step N+1 before step N's tokens arrive
        unsupported = [
            name
            for name, on in (
                ("speculative decoding", self.num_spec_tokens),
                ("KV connectors", self.connector is not None),
                ("LoRA", self.lora_config is not None),
                ("multimodal inputs", self.max_num_encoder_input_tokens),
                ("pipeline parallelism", self.use_pp),
            )
            if on
        ]
        if unsupported:
            raise KvschedError(f"kvsched policies inside vLLM do not support {', '.join(unsupported)} yet")
        policy, options, settings = settings_of(vllm_config)
        config = mirror_config(vllm_config, kv_cache_config.num_blocks, settings)
        self.mirror = Mirror(config, policy, options, in_flight=self.in_flight)
        self.steady_slots = SteadySlots(
            self.kv_cache_manager
        )  # the steps realize() need not ask vLLM's KV-cache manager for
        self._fallback = PolicyHooks(FALLBACK_POLICY, vllm_v1_options(vllm_config))
        self.faults = PolicyFaults(self.mirror.policy_name)
        self._dispatched: deque[tuple[Any, Any]] = (
            deque()
        )  # (vLLM's output, the mirror's step) of each step vLLM runs, oldest first
        self._started = 0.0  # when the last step was dispatched
        self._stopped: list[tuple[str, str]] | None = None  # requests vLLM ends while it applies a step
        self._tell: list[
            tuple[Any, FinishReason]
        ] = []  # requests ended here (ignored, failed), told to their clients at the next update
        self.abandoned: str | None = None  # why the mirror was given up; then vLLM's own scheduler decides
        self._compiling: dict[str, Any] = {}  # structured-output requests whose grammar vLLM compiles, by id

    # ------------------------------------------------------------------------------ requests
    def add_request(self, request: Any) -> None:
        super().add_request(request)
        if self.abandoned is not None:
            return
        try:
            self.mirror.add(request)
            if request.status is RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR:
                self._compiling[request.request_id] = request
        except (
            Exception
        ) as exc:  # a request the mirror refuses (engine serve's front end answers 400 first) fails alone
            self.faults.record(exc, "add_request", "that request fails (its client gets an error), the others run on")
            self.finish_requests(request.request_id, RequestStatus.FINISHED_ERROR)
            self._tell.append((request, FinishReason.ERROR))

    def _free_request(self, request: Any, delay_free_blocks: bool = False):
        """Every way a request ends in vLLM passes here (stops, aborts): the mirror ends it too."""
        if self._stopped is not None:
            self._stopped.append((request.request_id, request.status.name))
        elif self.abandoned is None:
            try:
                self.mirror.finish(request.request_id, request.status.name)
            except Exception as exc:
                self._abandon("finish", exc)
        return super()._free_request(request, delay_free_blocks)

    def reset_prefix_cache(self, *args: Any, **kwargs: Any) -> bool:
        """Refused while the mirror runs: it would still find the evicted blocks."""
        return super().reset_prefix_cache(*args, **kwargs) if self.abandoned is not None else False

    def _abandon(self, where: str, error: Exception) -> None:
        """kvsched's side failed in a way that leaves the mirror unlike vLLM's state (a bug of ours, or a
        policy raising what no hook call catches): vLLM's own scheduler decides every later step."""
        self.abandoned = f"{where}: {type(error).__name__}: {error}"
        self._dispatched.clear()
        self.faults.record(error, where, "kvsched's mirror is given up: vLLM's own scheduler decides from now on")

    # --------------------------------------------------------------------------------- steps
    def schedule(self, throttle_prefills: bool = False) -> Any:
        if self.abandoned is None:
            self.current_step += 1
            self.kv_cache_manager.new_step_starts()
            step = None
            try:
                step = self._decide()
                output = realize(self, step)
            except BaseException as exc:  # nothing of a step the mirror could not decide or vLLM not carry out may run
                _pass_exits(exc)
                self._abandon("schedule", exc)
                self.current_step -= 1  # vLLM's schedule() counts this step itself
                if step is not None:  # realize may have moved these requests half-way: they fail, the others run on
                    touched = {rid for rid, _ in step.block_ops} & set(self.requests)
                    for request in [self.requests[rid] for rid in touched]:
                        self.finish_requests(request.request_id, RequestStatus.FINISHED_ERROR)
                        self._tell.append((request, FinishReason.ERROR))
            else:
                free = self.kv_cache_manager.block_pool.get_num_free_blocks()
                if (
                    free != self.mirror.num_free_blocks
                ):  # vLLM's state is its own and whole: run this step, then vLLM decides
                    self._abandon(
                        "schedule",
                        MirrorDrift(f"vLLM has {free} free blocks, the mirror {self.mirror.num_free_blocks}"),
                    )
                else:
                    self._dispatch(output, step)
                return output
        return super().schedule(throttle_prefills)

    def _dispatch(self, output: Any, step: Any) -> None:
        """vLLM runs ``output`` now; with a step in flight the mirror applies it at once, with placeholders
        (``inflight.py``), and its ``on_step`` is told now, with the time since the previous dispatch."""
        started, self._started = self._started, time.perf_counter()
        self._dispatched.append((output, step))
        if self.in_flight:
            try:
                self.mirror.dispatch(step, self._started - started if started else 0.0)
            except PolicyError as exc:  # on_step raised after the core applied the whole step: nothing to undo
                self.faults.record(exc, "on_step", "the step stands; only the policy's report of it failed")
            except BaseException as exc:
                _pass_exits(exc)
                self._abandon("schedule", exc)

    def _decide(self) -> Any:
        """The policy's step on the mirror (``vllm-v1``'s if the policy fails: counted, logged once); ignored
        requests ended."""
        for rid, request in list(self._compiling.items()) if self._compiling else ():  # what vLLM's waiting loop checks
            if request.status is not RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR or grammar_compiled(
                self, request
            ):
                del self._compiling[rid]
                if not request.is_finished():
                    self.mirror.grammar_compiled(rid)
            elif isinstance(request.structured_output_request.grammar, Exception):
                del self._compiling[rid]  # vLLM ends it at the next update
        try:
            step = self.mirror.schedule()
        except PolicyError as exc:
            self.faults.record(exc)
            step = self.mirror.schedule(self._fallback)
        for group in step.ignored:
            self._ignore(self.requests[group.request_id])
        return step

    def _ignore(self, request: Any) -> None:
        """The policy can never run ``request`` (too long for the cache): it ends as vLLM ends an over-long prompt."""
        self.finish_requests(request.request_id, RequestStatus.FINISHED_IGNORED)
        self._tell.append((request, FinishReason.LENGTH))

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> dict[int, EngineCoreOutputs]:
        step = None
        if any(output is scheduler_output for output, _ in self._dispatched):
            while step is None:  # older ones scheduled nothing: vLLM's batch queue never runs those
                output, step = self._dispatched.popleft()
                step = step if output is scheduler_output else None
        if self.abandoned is not None:
            outputs = super().update_from_output(scheduler_output, model_runner_output)
        else:
            self._stopped = []
            try:
                outputs = super().update_from_output(scheduler_output, model_runner_output)
            finally:
                stopped, self._stopped = self._stopped, None
            try:
                if step is not None:
                    # What vLLM appended to each request (after its stop checks) is what it reports to the client.
                    sampled = {
                        o.request_id: o.new_token_ids
                        for eco in outputs.values()
                        for o in eco.outputs
                        if o.new_token_ids
                    }
                    if self.in_flight:
                        self.mirror.sampled(sampled)
                    else:
                        try:
                            self.mirror.complete(step, sampled, time.perf_counter() - self._started)
                        except (
                            PolicyError
                        ) as exc:  # on_step raised after the core applied the whole step: nothing to undo
                            self.faults.record(exc, "on_step", "the step stands; only the policy's report of it failed")
                for request_id, status in stopped:
                    self.mirror.finish(request_id, status)
            except BaseException as exc:
                _pass_exits(exc)
                self._abandon("update_from_output", exc)
        for request, reason in self._tell:
            finished = EngineCoreOutput(request_id=request.request_id, new_token_ids=[], finish_reason=reason)
            outputs.setdefault(request.client_index, EngineCoreOutputs()).outputs.append(finished)
        self._tell.clear()
        return outputs


class KvschedScheduler(StepLogging, PolicyScheduler):
    """The class to give vLLM: ``PolicyScheduler`` with the optional step log (``steplog.py``). With async
    scheduling on (vLLM's default on a GPU) it makes itself a ``KvschedAsyncScheduler``, as vLLM's own
    ``SchedulerConfig.get_scheduler_cls`` picks ``AsyncScheduler``: one ``--scheduler-cls`` for both."""

    def __new__(cls, vllm_config: Any = None, *args: Any, **kwargs: Any) -> KvschedScheduler:
        if cls is KvschedScheduler and vllm_config is not None and vllm_config.scheduler_config.async_scheduling:
            cls = KvschedAsyncScheduler
        return super().__new__(cls)


class KvschedAsyncScheduler(KvschedScheduler, AsyncScheduler):
    """``KvschedScheduler`` over vLLM's ``AsyncScheduler``: the same policy code, scheduling step N+1
    while step N runs (``inflight.py``)."""
