"""Whose mechanics the core follows (vLLM v0's or V1's): how a step takes blocks, what ``n > 1`` is, how a step
completes. A policy and its hooks are the same on every one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvsched.allocators.block_manager import BlockManager
from kvsched.core.async_lag import AsyncLag, SchedulerTime
from kvsched.core.completion import Completion
from kvsched.core.step_state import StepState
from kvsched.core.step_v1 import V1StepState

if TYPE_CHECKING:
    from collections.abc import Callable

    from kvsched.core.config import EngineConfig
    from kvsched.core.engine import Engine
    from kvsched.core.sequence import Sequence


@dataclass(frozen=True)
class Mechanics:
    """vLLM v0's, V1's, or V1's with a step in flight (``kvsched.integrations.vllm.inflight``)."""

    name: str
    vllm_engine: str  # the EngineConfig.vllm_engine these mechanics are
    step: type[StepState]  # the rules a step is built by (how it takes blocks, what it refuses)
    fans_out: bool = False  # a request with n > 1 runs as n requests (V1's front end, core/fanout.py)
    null_block: int = 0  # blocks kept back from the pool, never allocated (V1's null block)
    keeps_duplicates: bool = False  # a full block computed twice keeps both copies (V1), else one is shared (v0)
    drafts: bool = False  # decoding requests take draft tokens (EngineConfig.num_speculative_tokens)
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

    def completion(self, engine: Engine) -> Completion:
        config = engine.config
        if config.async_scheduling:
            return AsyncLag(engine)
        if config.scheduler_ms or config.scheduler_request_ms:
            return SchedulerTime(engine)
        return Completion(engine)


V0 = Mechanics("v0", "v0", StepState, lane=True, past_model_len=1, names_as_applied=True)
V1 = Mechanics("v1", "v1", V1StepState, fans_out=True, null_block=1, keeps_duplicates=True, drafts=True, offloads=True)

MECHANICS = {"v0": V0, "v1": V1}  # by EngineConfig.vllm_engine
