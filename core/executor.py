"""The contract between the engine and whatever runs a step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from kvsched.core.engine import Engine
    from kvsched.core.outputs import SchedulerOutput
    from kvsched.core.sequence import SequenceGroup


class Clock(Protocol):
    """What the engine needs of time: read it, charge a step's duration, wait for an arrival
    (``kvsched.executors.clocks`` has the virtual and the wall clock)."""

    def now(self) -> float: ...

    def advance(self, seconds: float) -> None: ...

    def wait_until(self, t: float) -> None: ...


@dataclass
class StepResult:
    """How long the step took and the tokens sampled, per sequence id.

    A sequence samples when the step computes its last uncomputed token. The prompt step of a request with ``n > 1``
    returns ``n`` tokens for its single sequence: the engine keeps the first and forks one child per other token."""

    duration: float
    tokens: dict[int, list[int]] = field(default_factory=dict)


class Executor(Protocol):
    """Runs steps. An executor that reads block tables may also define ``attach(block_manager)``,
    which the engine calls once with its own block manager."""

    eos_token_id: int | None

    def make_clock(self): ...

    def execute(self, output: SchedulerOutput) -> StepResult: ...


@runtime_checkable
class KnownTokens(Protocol):
    """An executor whose decode tokens are known before it runs (the simulator's): it hands the engine its fast path
    (``kvsched.executors.fast_path``), whose decode lane advances plain decodes together, reading their tokens from
    the executor (``kvsched.executors.decode_lane.Tokens``). A promise: ``execute`` skips (returns no tokens for) the
    first ``output.lane_decodes`` entries of ``output.scheduled``, which the engine takes from the lane; an executor
    that cannot keep it must not offer a lane (or run with ``decode_lane=False``)."""

    def fast_path(self, engine: Engine) -> FastPath | None: ...


class FastPath(Protocol):
    """The one door from the core to the simulator's fast path (``kvsched.executors.fast_path`` has the why): the
    step builder and the completion step drive its decode lane (``take``, ``apply``); the scheduler asks it to
    ``replay`` the last step (a steady one, if still valid) before asking the policy, and tells it each step it
    ``record``s, rolls back, and each group it ``touch``es (aborts, preempts, operates on); ``Engine.steady_run`` asks
    it to ``advance`` a steady run. Its counters are the core's (``Scheduler.seqs_ended``, ``Engine.steps_ran``)."""

    def take(self, step, decodes_only: bool, cap: int | None) -> bool: ...  # the lane takes a step's decodes

    def apply(self, completion, now: float, finished: list[SequenceGroup]) -> bool: ...  # a lane step ran: it ends some

    def replay(self, policy: bool) -> SchedulerOutput | None: ...

    def record(self, step, waiting: list[SequenceGroup]) -> None: ...

    def rollback(self) -> None: ...

    def touch(self, group: SequenceGroup) -> None: ...  # the core changes group on its own (preempted, aborted, ...)

    def audit(self, running: list[SequenceGroup]) -> list[str]: ...

    def advance(self, until: float, join, limit: float, observe, fence: float, resume: bool): ...  # a steady run
