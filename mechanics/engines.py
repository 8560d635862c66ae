"""vLLM's two engines as the core's mechanics (``EngineConfig.vllm_engine``), registered as the entry points
``kvsched.mechanics`` ``v0`` and ``v1``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvsched.core.mechanics import Mechanics
from kvsched.core.step_state import StepState
from kvsched.mechanics.async_lag import AsyncLag, SchedulerTime
from kvsched.mechanics.completion import Completion
from kvsched.mechanics.fanout import FanOut
from kvsched.mechanics.step_v1 import V1StepState, remember_drafts

if TYPE_CHECKING:
    from kvsched.core.engine import Engine


def completion(engine: Engine) -> Completion:
    """The completion step the engine's config asks for: outputs a step late, the scheduler's time, or neither."""
    config = engine.config
    if config.async_scheduling:
        return AsyncLag(engine)
    if config.scheduler_ms or config.scheduler_request_ms:
        return SchedulerTime(engine)
    return Completion(engine)


V0 = Mechanics("v0", "v0", StepState, completion, lane=True, past_model_len=1, names_as_applied=True)
V1 = Mechanics(
    "v1",
    "v1",
    V1StepState,
    completion,
    fan_out=FanOut,
    drafts=remember_drafts,
    null_block=1,
    keeps_duplicates=True,
    offloads=True,
)
