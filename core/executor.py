"""The contract between the engine and whatever runs a step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from collections.abc import Callable

    from kvsched.allocators.block_manager import BlockManager
    from kvsched.core.outputs import ScheduledGroup, SchedulerOutput
    from kvsched.core.sequence import Sequence, SequenceGroup


class Clock(Protocol):
    """What the engine needs of time: read it, charge a step's duration, wait for an arrival
    (``kvsched.executors.clocks`` has the virtual and the wall clock)."""

    def now(self) -> float: ...

    def advance(self, seconds: float) -> None: ...

    def wait_until(self, t: float) -> None: ...


@dataclass
class StepResult:
    """How long the step took and the tokens sampled, per sequence id.

    A sequence samples when the step computes its last uncomputed token. The prompt step of a
    request with ``n > 1`` returns ``n`` tokens for its single sequence: the engine keeps the
    first and forks one child per other token.
    """

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
    """An executor whose one-sequence decode tokens are known before it runs (the simulator's).

    The engine then advances plain decodes in the ``DecodeLane`` the executor hands it (the
    simulator's is ``kvsched.executors.decode_lane``), writing their tokens out only when someone
    reads them. Implementing these methods is a promise: ``execute`` must sample exactly
    ``tokens_at`` for a one-sequence group, and skip (return no tokens for) the first
    ``output.lane_decodes`` entries of ``output.scheduled``, whose tokens the engine takes from
    the lane. An executor that cannot promise this (a subclass that changes the tokens) must not
    implement them, or must run with ``EngineConfig(decode_lane=False)``. Positions count output
    tokens from 1.
    """

    def decode_lane(self, block_manager: BlockManager) -> DecodeLane:
        """A lane over ``block_manager`` that takes its tokens from this executor."""
        ...

    def tokens_at(self, group: SequenceGroup, start: int, stop: int) -> list[int]:
        """The tokens a one-sequence ``group`` samples at output positions ``start`` .. ``stop - 1``."""
        ...

    def first_stop(self, group: SequenceGroup, start: int) -> int | None:
        """The first position from ``start`` on whose token is in ``group.stop_tokens`` (None: never)."""
        ...


@runtime_checkable
class KnownDurations(Protocol):
    """An executor that says what a step of only decode-lane decodes costs, exactly as ``execute`` would
    charge it: the engine then advances steady runs at once (docs/hooks.md). A promise, like ``KnownTokens``."""

    def lane_seconds(self, num_seqs: int) -> Callable[[int], float]:
        """The duration of a lane step of ``num_seqs`` decodes, as a function of the context tokens they read."""
        ...


class DecodeLane(Protocol):
    """What the core asks of a decode lane (``kvsched.executors.decode_lane`` has the why and how)."""

    scheduled: int  # members in the step being built (0: the step is not a lane step)
    kv_tokens: int  # context tokens the members' next decodes read
    batch: list[ScheduledGroup]  # the members' decode entries, in running order

    def schedule(self, running: list[SequenceGroup], out: SchedulerOutput | None, max_tokens: int, touched: dict | None,
                 decodes_only: bool = False, cap: int | None = None) -> bool:
        """Put every running group in ``out`` (None: in no output) as one decode if the lane is exact for
        this step (and mark them in ``touched``)."""
        ...

    def apply(self) -> list[Sequence]:
        """The lane step ran; the members that sampled their last token, out of the lane."""
        ...

    def coast(self) -> bool:
        """Take the next step of a steady run at once if nobody finishes in it and a block is left to spare."""
        ...

    def dissolve(self) -> None:
        """Every member leaves, its tokens written out."""
        ...

    def rollback(self) -> None:
        """The step being built was abandoned."""
        ...

    def audit(self, running: list[SequenceGroup]) -> list[str]:
        """Members that are not what the lane assumes."""
        ...


def samplers(scheduled: ScheduledGroup) -> list[tuple[Sequence, int]]:
    """``scheduled.samples()``, by its older name."""
    return scheduled.samples()
