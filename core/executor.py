"""The contract between the engine and whatever runs a step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from kvsched.core.engine import Engine
    from kvsched.core.outputs import SchedulerOutput
    from kvsched.core.sequence import SequenceGroup


class Clock(Protocol):
    """What the engine needs of time (``kvsched.executors.clocks`` has the virtual and the wall clock)."""

    def now(self) -> float: ...

    def advance(self, seconds: float) -> None: ...

    def wait_until(self, t: float) -> None: ...


@dataclass
class StepResult:
    """How long the step took and the tokens sampled, by sequence id: a sequence samples when the step computes its
    last uncomputed token, ``n`` tokens in the prompt step of ``n > 1`` (the engine forks one child per extra)."""

    duration: float
    tokens: dict[int, list[int]] = field(default_factory=dict)


class Executor(Protocol):
    """Runs steps; one that reads block tables may define ``attach(block_manager)``, called once by the engine."""

    eos_token_id: int | None

    def make_clock(self): ...

    def execute(self, output: SchedulerOutput) -> StepResult: ...


@runtime_checkable
class KnownTokens(Protocol):
    """An executor whose decode tokens are known before it runs (the simulator's) hands the engine its fast path. Its
    promise: ``execute`` returns no tokens for the first ``output.lane_decodes`` in ``output.scheduled``."""

    def fast_path(self, engine: Engine) -> FastPath | None: ...


class FastPath(Protocol):
    """The one door from the core to the simulator's fast path (``kvsched.executors.fast_path`` has the why)."""

    def take(self, step, decodes_only: bool, cap: int | None) -> bool: ...  # the lane takes a step's decodes

    def apply(self, completion, now: float, finished: list[SequenceGroup]) -> bool: ...  # a lane step ran: it ends some

    def replay(self, policy: bool) -> SchedulerOutput | None: ...  # the last step again, if steady and still valid

    def record(self, step, waiting: list[SequenceGroup]) -> None: ...

    def rollback(self) -> None: ...

    def touch(self, group: SequenceGroup) -> None: ...  # the core changes group on its own (preempted, aborted, ...)

    def audit(self, running: list[SequenceGroup]) -> list[str]: ...

    def advance(self, until: float, join, limit: float, observe, fence: float, resume: bool): ...  # a steady run
