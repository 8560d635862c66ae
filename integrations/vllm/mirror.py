"""A kvsched engine that mirrors one vLLM scheduler: same requests, same tokens, same KV cache.

The policy runs here, on kvsched's own core, unchanged: the same hooks, step operations, views
and validation as in simulation. The core follows vLLM V1's mechanics (``vllm_engine="v1"``), which
``tests/test_vllm_v1_differential.py`` holds step-exact against vLLM's KV-cache manager, so a
decision taken here can be replayed on vLLM's state as it was taken (``realize.py``), and after
every step both caches hold the same number of free blocks (checked).
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from kvsched.core.config import EngineConfig
from kvsched.core.engine import Engine
from kvsched.core.executor import StepResult
from kvsched.core.request import LABELS, Request, SamplingParams
from kvsched.core.sequence import SequenceStatus
from kvsched.errors import KvschedError, quote
from kvsched.integrations.vllm.inflight import PLACEHOLDER, V1_IN_FLIGHT, num_placeholders

if TYPE_CHECKING:
    from kvsched.core.outputs import SchedulerOutput
    from kvsched.core.plugins import PolicyHooks
    from kvsched.core.report import StepReport

# vLLM's finished states in kvsched's terms (anything else, an error or a repetition stop, ends as aborted).
_FINISHED = {
    "FINISHED_STOPPED": SequenceStatus.FINISHED_STOPPED,
    "FINISHED_LENGTH_CAPPED": SequenceStatus.FINISHED_LENGTH_CAPPED,
}


class EpochClock:
    """Seconds since the mirror started, on the clock vLLM stamps arrivals with (``time.time()``)."""

    def __init__(self) -> None:
        self.start = time.time()

    def now(self) -> float:
        return time.time() - self.start

    def advance(self, seconds: float) -> None:
        pass  # real work takes real time

    def wait_until(self, t: float) -> None:
        pass  # vLLM decides when to step


class TokensFromVllm:
    """The mirror's executor: it runs nothing; ``complete`` hands it the tokens vLLM sampled."""

    eos_token_id = None  # vLLM decides stops; the mirror is told (``Mirror.finish``)

    def make_clock(self) -> EpochClock:
        return EpochClock()

    def execute(self, output: SchedulerOutput) -> StepResult:
        raise RuntimeError("the vLLM mirror does not execute steps; vLLM's model runner does")


# The engine settings vLLM decides, with the vLLM option that sets each (None: fixed by the integration).
VLLM_OWNS = {
    "block_size": "--block-size",
    "num_gpu_blocks": "--num-gpu-blocks-override",
    "watermark": "--watermark",
    "enable_prefix_caching": "--enable-prefix-caching",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "max_num_seqs": "--max-num-seqs",
    "max_model_len": "--max-model-len",
    "vllm_engine": None,
    "num_cpu_blocks": None,
    "decode_lane": None,
}


def check_settings(settings: dict[str, Any]) -> None:
    """Refuse (``KvschedError``) a kvsched setting that vLLM's own settings decide inside vLLM; ``engine serve``
    asks before vLLM starts, the mirror again in vLLM's engine core."""
    clash = [name for name in settings if name in VLLM_OWNS]
    if clash:
        how = [f"vLLM's {VLLM_OWNS[n]}" if VLLM_OWNS[n] else f"{n} is fixed: vLLM V1's mechanics" for n in clash]
        raise KvschedError(
            f"{', '.join(clash)} {'is' if len(clash) == 1 else 'are'} set by vLLM inside vLLM, "
            f"not by the kvsched config ({'; '.join(how)})"
        )


class RefusedField(ValueError):
    """A client's field the mirror refuses; ``field`` is its name in the client's request."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def request_fields(priority: Any, extra_args: dict[str, Any] | None) -> dict[str, Any]:
    """A vLLM request's priority and labels (``vllm_xargs``: tenant, session, SLO class) as the mirror
    takes them, checked by kvsched's ``Request`` itself; ``RefusedField`` (one line) for one it would refuse."""
    labels = {name: value for name, value in (extra_args or {}).items() if name in LABELS}
    try:
        probe = Request(request_id="probe", prompt_len=1, priority=priority, **labels)
    except ValidationError as exc:
        error = exc.errors()[0]
        name = str(error["loc"][0])
        field = f"vllm_xargs.{name}" if name in LABELS else name
        raise RefusedField(
            field, f"{error['msg'].removeprefix('Value error, ')} (got {quote(error.get('input'))})"
        ) from None
    return {"priority": probe.priority, **{name: getattr(probe, name) for name in LABELS}}


def mirror_config(vllm_config: Any, num_blocks: int, settings: dict[str, Any] | None = None) -> EngineConfig:
    """The kvsched engine settings that mean what ``vllm_config`` means, with V1's mechanics, plus
    ``settings`` for what vLLM has no knob for (``delay_factor``, ``audit_every_step``)."""
    check_settings(settings or {})
    sched, cache = vllm_config.scheduler_config, vllm_config.cache_config
    owned = dict(
        vllm_engine="v1",
        block_size=cache.block_size,
        num_gpu_blocks=num_blocks,
        num_cpu_blocks=0,
        watermark=sched.watermark,
        enable_prefix_caching=bool(cache.enable_prefix_caching),
        max_num_batched_tokens=sched.max_num_batched_tokens,
        max_num_seqs=sched.max_num_seqs,
        enable_chunked_prefill=bool(
            sched.enable_chunked_prefill
        ),  # off: whole prompts, head of line (vLLM's --no-enable-chunked-prefill)
        max_model_len=vllm_config.model_config.max_model_len,
        decode_lane=False,
    )
    return EngineConfig(**owned, **(settings or {}))


class Mirror:
    """The kvsched side: requests added and finished as vLLM adds and finishes them.

    ``in_flight``: vLLM schedules with a step in flight (async scheduling, ``inflight.py``): a step
    is applied when it is dispatched (``dispatch``), with placeholders for the tokens it samples,
    and those are replaced by vLLM's when they arrive (``sampled``); else a step is applied when its
    tokens arrive (``complete``).
    """

    def __init__(
        self, config: EngineConfig, policy: str, options: dict[str, Any] | None = None, in_flight: bool = False
    ) -> None:
        mechanics = V1_IN_FLIGHT if in_flight else None
        self.engine = Engine(config, policy, TokensFromVllm(), mechanics=mechanics, policy_options=options)
        self._seq_of: dict[str, int] = {}  # request id -> the mirror sequence's id
        self.in_flight = in_flight

    @property
    def policy_name(self) -> str:
        return self.engine.policy_name

    def add(self, request: Any) -> None:
        """Mirror a vLLM ``Request``: its prompt, output budget, priority and labels (``vllm_xargs``)."""
        params = request.sampling_params
        fields = request_fields(request.priority, getattr(params, "extra_args", None))
        arrival = max(0.0, request.arrival_time - self.engine.clock.start)
        group = self.engine.add_request(
            Request(
                request_id=request.request_id,
                prompt_token_ids=tuple(request.prompt_token_ids),
                sampling=SamplingParams(max_tokens=max(1, params.max_tokens or 1), ignore_eos=True),
                arrival_time=arrival,
                **fields,
            )
        )
        self._seq_of[request.request_id] = group.seqs[0].seq_id
        if request.use_structured_output:  # vLLM compiles its grammar in the background: not ready until vLLM says so
            group.grammar_ready_at = math.inf
        if self.in_flight:  # a placeholder may go one past the limit: vLLM ends the request when its last token arrives
            group.max_seq_tokens += 1

    def schedule(self, fallback: PolicyHooks | None = None) -> SchedulerOutput:
        """The policy's step (or ``fallback``'s, on the same state)."""
        return self.engine.schedule(fallback)

    def complete(self, output: SchedulerOutput, sampled: dict[str, list[int]], duration: float) -> StepReport:
        """vLLM ran ``output`` and sampled ``sampled`` (request id -> new tokens); apply it here."""
        tokens = {self._seq_of[rid]: list(ids) for rid, ids in sampled.items() if ids}
        return self.engine.complete(output, StepResult(duration, tokens))

    def dispatch(self, output: SchedulerOutput, duration: float) -> StepReport:
        """vLLM dispatched ``output`` with a step in flight: apply it now, a placeholder for each token it samples."""
        tokens = {seq.seq_id: [PLACEHOLDER] for sg in output.scheduled for seq in sg.group.seqs}
        return self.engine.complete(output, StepResult(duration, tokens))

    def sampled(self, sampled: dict[str, list[int]]) -> None:
        """The tokens of the oldest step in flight arrived (request id -> new tokens; vLLM ended some already):
        they replace its placeholders, and the blocks they complete are named (vLLM's ``cache_blocks``)."""
        bm, groups = self.engine.scheduler.block_manager, self.engine.sequence_groups
        for rid, ids in sampled.items():
            group = groups.get(rid)
            if not ids or group is None or group.is_finished:
                continue
            seq = group.seqs[0]
            pending = num_placeholders(seq)
            if len(ids) > pending:
                raise KvschedError(
                    f"vLLM sampled {len(ids)} tokens for {rid!r}, the mirror holds {pending} placeholders"
                )
            start = len(seq.output) - pending
            seq.output[start : start + len(ids)] = ids
            if seq.status is SequenceStatus.RUNNING:
                bm.mark_computed(seq, seq.num_computed_tokens - (pending - len(ids)))

    def grammar_compiled(self, request_id: str) -> None:
        """vLLM found the structured-output request's grammar compiled: from this step on it may be admitted."""
        self.engine.sequence_groups[request_id].grammar_ready_at = self.engine.now

    def finish(self, request_id: str, vllm_status: str) -> None:
        """vLLM ended the request (a stop token, EOS, a client abort): end it here too."""
        self.engine.abort(request_id, _FINISHED.get(vllm_status, SequenceStatus.FINISHED_ABORTED))
        self._seq_of.pop(request_id, None)

    @property
    def num_free_blocks(self) -> int:
        return self.engine.cache.num_free_gpu_blocks
