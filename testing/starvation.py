"""The starvation check: does a request finish while a stream of more favoured requests never lets up?"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from kvsched.core.engine import Engine
from kvsched.executors.simulated import SimulatedExecutor
from kvsched.testing.strategies import OVERLOAD_CONFIG, OVERLOAD_PROFILE, VICTIM_TENANTS, OverloadScenario


@dataclass(frozen=True)
class Churn:
    """The request preempted most often in a scenario: how often, and the computed tokens its preemptions threw away."""

    request_id: str = ""
    preemptions: int = 0
    discarded_tokens: int = 0

    def __str__(self) -> str:
        times = "once" if self.preemptions == 1 else f"{self.preemptions} times"
        return (
            f"{self.request_id} was preempted {times}, {self.discarded_tokens:,} computed tokens thrown away"
            if self.preemptions
            else "no request was preempted"
        )


@dataclass(frozen=True)
class StarvationResult:
    finished_at: float | None  # when the last victim finished; None if one had not by the horizon
    horizon_s: float
    stream_served: int
    starved_ids: tuple[str, ...] = ()
    churn: Churn = Churn()

    @property
    def starved(self) -> bool:
        return self.finished_at is None


def run_overload(policy: Any, scenario: OverloadScenario, policy_options: dict | None = None) -> StarvationResult:
    """Replay the scenario until every victim finishes or the stream's last arrival passes."""
    executor = SimulatedExecutor(OVERLOAD_PROFILE)
    engine = Engine(OVERLOAD_CONFIG, policy, executor, policy_options=policy_options)
    pending = deque(scenario.requests())
    clock = engine.clock
    victims = []
    while clock.now() <= scenario.horizon_s:
        while pending and pending[0].arrival_time <= clock.now():
            group = engine.add_request(pending.popleft())
            if group.request_id.startswith("victim"):
                victims.append(group)
        if len(victims) == len(VICTIM_TENANTS) and all(v.is_finished for v in victims):
            return StarvationResult(
                max(v.finish_time for v in victims), scenario.horizon_s, _served(engine), churn=_churn(engine)
            )
        if not engine.has_unfinished():
            clock.wait_until(pending[0].arrival_time)
            continue
        report = engine.step()
        if report.output.is_empty and not report.finished and pending:
            clock.wait_until(pending[0].arrival_time)
    starved = tuple(v.request_id for v in victims if not v.is_finished)
    return StarvationResult(None, scenario.horizon_s, _served(engine), starved, _churn(engine))


def _churn(engine: Engine) -> Churn:
    """The most preempted request of the run so far, finished or not."""
    group = max(
        engine.sequence_groups.values(),
        key=lambda g: (g.num_recompute_preemptions + g.num_swap_preemptions, -g.index),
        default=None,
    )
    if group is None:
        return Churn()
    return Churn(
        group.request_id, group.num_recompute_preemptions + group.num_swap_preemptions, group.num_discarded_tokens
    )


def _served(engine: Engine) -> int:
    return sum(1 for g in engine.finished if not g.request_id.startswith("victim"))
