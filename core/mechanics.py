"""Whose mechanics the core follows (vLLM v0's or V1's): how a step takes blocks, what ``n > 1`` is, how a step
completes. The core declares the seam; ``kvsched/mechanics/`` fills it, found by name among the entry points
``kvsched.mechanics``. A policy and its hooks are the same on every one."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from kvsched.allocators.block_manager import BlockManager
from kvsched.errors import PolicyError, UnknownPolicyError, quote
from kvsched.plugins.discovery import load_policy

if TYPE_CHECKING:
    from collections.abc import Callable

    from kvsched.core.config import EngineConfig
    from kvsched.core.engine import Engine
    from kvsched.core.executor import StepResult
    from kvsched.core.outputs import SchedulerOutput
    from kvsched.core.sequence import Sequence, SequenceGroup
    from kvsched.core.step_state import StepState


class CompletionStep(Protocol):
    """What the engine asks of a step's completion (``mechanics/completion.py``): apply its sampled tokens."""

    timed: bool  # the step's time includes the scheduler's: ``charge`` before it completes, ``ran`` after
    lags: bool  # the scheduler sees arrivals later than they come (``seen_at``)

    def apply(self, output: SchedulerOutput, tokens: dict[int, list[int]], now: float) -> list[SequenceGroup]: ...
    def seen_at(self, now: float) -> float: ...
    def charge(self, output: SchedulerOutput, result: StepResult) -> None: ...
    def ran(self, output: SchedulerOutput, now: float) -> None: ...


@dataclass(frozen=True)
class Mechanics:
    """vLLM v0's, V1's, or V1's with a step in flight (``kvsched.integrations.vllm.inflight``)."""

    name: str
    vllm_engine: str  # the EngineConfig.vllm_engine these mechanics are
    step: type[StepState]  # the rules a step is built by (how it takes blocks, what it refuses)
    completion: Callable[[Engine], CompletionStep]  # the one an engine's config asks for
    fan_out: Callable[[Engine], object] | None = None  # a request with n > 1 runs as n requests (mechanics/fanout.py)
    drafts: Callable[..., None] | None = None  # after each step, which sequences take draft tokens next (V1)
    null_block: int = 0  # blocks kept back from the pool, never allocated (V1's null block)
    keeps_duplicates: bool = False  # a full block computed twice keeps both copies (V1), else one is shared (v0)
    lane: bool = False  # plain decodes may ride the decode lane (its block rule is v0's worst case)
    past_model_len: int = 0  # tokens a sequence holds past max_model_len: v0 caps it once longer, V1 once that long
    names_as_applied: bool = False  # prefix caching names full blocks as a step is applied (v0), else as taken (V1)
    offloads: bool = False  # a CPU tier may stand behind the prefix cache (EngineConfig.kv_offloading_blocks)
    # How many of a sequence's last tokens a step in flight samples (vLLM's placeholders; None: no step in flight)
    in_flight: Callable[[Sequence], int] | None = None

    def block_manager(self, config: EngineConfig) -> BlockManager:
        blocks = config.num_gpu_blocks - self.null_block
        return BlockManager(
            config.block_size,
            blocks,
            config.num_cpu_blocks,
            config.watermark_blocks,
            config.enable_prefix_caching,
            keep_duplicates=self.keeps_duplicates,
        )


@functools.cache
def installed(vllm_engine: str) -> Mechanics:
    """The installed mechanics of ``vllm_engine`` (an entry point of ``kvsched.mechanics``), loaded once."""
    try:
        mechanics = load_policy(vllm_engine, "mechanics")
    except UnknownPolicyError:  # an install older than the entry points (no file path can name mechanics)
        raise UnknownPolicyError(f"no mechanics {vllm_engine!r} installed: reinstall kvsched (make setup)") from None
    if not isinstance(mechanics, Mechanics) or mechanics.vllm_engine != vllm_engine:
        raise PolicyError(vllm_engine, f"is {quote(mechanics)}, not Mechanics of {vllm_engine}", role="mechanics")
    return mechanics
