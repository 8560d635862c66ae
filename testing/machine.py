"""A Hypothesis state machine that drives an engine under a policy with random arrivals, aborts and steps.

``PolicyMachine.for_policy(policy)`` returns a machine class bound to one policy; run it with
``hypothesis.stateful.run_state_machine_as_test``. After every rule the machine checks the
universal invariants (``kvsched.testing.invariants``) and, when the policy claims it,
priority-respecting preemption; at teardown it stops arrivals and drains the engine.
Invariants named in ``skip`` are not checked, and an example that trips one is discarded, so
that the remaining invariants can still be judged for a policy that breaks one of them.
"""

from __future__ import annotations

from typing import Any

from hypothesis import assume
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from kvsched.core.decisions import Preemption
from kvsched.core.engine import Engine
from kvsched.core.hookspecs import hookimpl
from kvsched.core.sequence import SequenceStatus
from kvsched.core.view import frozen
from kvsched.errors import AuditError, PolicyError, shorten
from kvsched.executors.simulated import SimulatedExecutor
from kvsched.plugins.discovery import load_policy
from kvsched.testing import invariants as inv
from kvsched.testing.claims import PRIORITY_PREEMPTION, declared_claims
from kvsched.testing.strategies import engine_configs, request_specs

STALL_STEPS = 200  # consecutive steps that run nothing (0.2 simulated seconds) before a drain is a stall


class _Discard(Exception):
    """An unjudged invariant tripped while draining: the example says nothing more."""


class PreemptionWatch:
    """An observer wrapping ``choose_preemption``: records every victim more urgent than its requester."""

    def __init__(self) -> None:
        self.urgency = None  # set once the engine has instantiated the policy
        self.violations: list[str] = []

    @hookimpl(wrapper=True)
    def choose_preemption(self, step, requester):
        choice = yield
        if isinstance(choice, Preemption) and choice.victim is not requester:
            v, r = self.urgency(step, choice.victim), self.urgency(step, requester)
            if v < r:
                self.violations.append(
                    f"{choice.victim.request_id} (urgency {v:.3g}) was preempted for the less urgent "
                    f"{requester.request_id} (urgency {r:.3g}) at t={step.now:.3f}"
                )
        return choice


class PolicyMachine(RuleBasedStateMachine):
    """Random arrivals, aborts and steps against one policy; subclasses bind the policy."""

    policy: Any = "vllm-default"
    policy_options: dict[str, Any] | None = None
    skip: frozenset[str] = frozenset()

    @classmethod
    def for_policy(cls, policy: Any, options: dict[str, Any] | None = None, skip=frozenset()) -> type[PolicyMachine]:
        if isinstance(policy, str):
            policy = load_policy(policy)  # once, not per example
        return type(
            f"{cls.__name__}_{getattr(policy, '__name__', 'policy')}",
            (cls,),
            {"policy": policy, "policy_options": options, "skip": frozenset(skip)},
        )

    def __init__(self) -> None:
        super().__init__()
        self.engine: Engine | None = None
        self.submitted = 0
        self.failed = False  # teardown still runs after a failed rule: it must not fail again
        self._draining = False

    def _checking(self, name: str) -> bool:
        return name not in self.skip

    def _violation(self, name: str, message: str) -> None:
        self.failed = True
        if self._checking(name):
            raise inv.InvariantViolation(name, message)
        if self._draining:
            raise _Discard(name)  # Hypothesis cannot reject an example from teardown: stop draining instead
        assume(False)  # not judged in this run: discard the example

    @initialize(config=engine_configs())
    def start(self, config) -> None:
        policy = load_policy(self.policy) if isinstance(self.policy, str) else self.policy
        watching = PRIORITY_PREEMPTION in declared_claims(policy) and self._checking(PRIORITY_PREEMPTION)
        self.watch = PreemptionWatch() if watching else None
        try:
            self.engine = Engine(
                config,
                policy,
                SimulatedExecutor(),
                policy_options=self.policy_options,
                observers=(self.watch,) if watching else (),
            )
        except PolicyError as exc:
            self._violation(inv.VALID_DECISIONS, str(exc))
        self.limits = frozen(
            self.engine.config
        )  # what the budgets are judged by: taken before any hook ran, out of every hook's reach
        if watching:  # judge by this engine's own policy instance
            self.watch.urgency = getattr(self.engine.hooks.policy, "urgency", None) or (lambda step, g: g.priority)

    @rule(spec=request_specs())
    def arrive(self, spec) -> None:
        request = spec.build(f"r{self.submitted}", self.engine.clock.now(), self.submitted + 1)
        self.submitted += 1
        self.engine.add_request(request)

    # No preconditions: a rule that has nothing to do is a no-op, so that the shrinker can delete
    # any step on its own (an arrival without its abort, an abort without its arrival).
    @rule(count=st.integers(1, 12))
    def run_steps(self, count: int) -> None:
        for _ in range(count):
            if not self.engine.has_unfinished():
                break
            self._step()

    @rule(pick=st.integers(0, 2**16))
    def abort(self, pick: int) -> None:
        """Abort the request ``r{pick mod submitted}`` wherever it is (nothing if it already ended)."""
        if self.submitted:
            self.engine.abort(f"r{pick % self.submitted}")

    def _step(self):
        engine = self.engine
        try:
            report = engine.step()
        except PolicyError as exc:
            self._violation(inv.VALID_DECISIONS, str(exc))
        except Exception as exc:  # whatever a policy managed to provoke is judged, not a crash of the suite
            self._violation(inv.VALID_DECISIONS, f"the engine raised {type(exc).__name__}: {shorten(str(exc))}")
        problem = budget_violation(engine, report, self.limits)
        if problem:
            self._violation(inv.BUDGETS_RESPECTED, problem)
        if self.watch is not None and self.watch.violations:
            self._violation(PRIORITY_PREEMPTION, self.watch.violations[0])
        return report

    @invariant()
    def allocator_consistent(self) -> None:
        if self.engine is None:
            return
        try:
            self.engine.check()
        except AuditError as exc:
            self._violation(inv.ALLOCATOR_CONSISTENT, str(exc))

    def teardown(self) -> None:
        if self.engine is None or self.failed:
            return
        self._draining = True
        try:
            self._drain()
        except _Discard:
            pass

    def _drain(self) -> None:
        engine = self.engine
        groups = [g for g in engine.sequence_groups.values() if not g.is_finished]
        bound = 200 + 8 * sum(
            (g.request.prompt_len + g.request.sampling.max_tokens) * g.request.sampling.n for g in groups
        )
        steps = idle = 0
        while engine.has_unfinished():
            if steps >= bound or idle >= STALL_STEPS:
                why = (
                    f"no progress for {idle} steps"
                    if idle >= STALL_STEPS
                    else f"still unfinished after {steps} steps (bound {bound})"
                )
                left = [g.request_id for g in engine.sequence_groups.values() if not g.is_finished]
                self._violation(
                    inv.FINISHES_WITHIN_BOUND, f"{why}: unfinished {left[:5]}; {engine.scheduler.stuck_report()}"
                )
                return
            report = self._step()
            idle = idle + 1 if report.output.is_empty and not report.finished else 0
            steps += 1
        bm = engine.scheduler.block_manager
        if engine.leaked_blocks or bm.gpu.num_free != bm.gpu.num_blocks or bm.cpu.num_free != bm.cpu.num_blocks:
            self._violation(
                inv.NO_LEAKED_BLOCKS,
                f"{engine.leaked_blocks} blocks still held after every request finished "
                f"(gpu free {bm.gpu.num_free}/{bm.gpu.num_blocks}, cpu free {bm.cpu.num_free}/{bm.cpu.num_blocks})",
            )


def budget_violation(engine: Engine, report, config=None) -> str | None:
    """What a step broke of the budgets and the KV capacity, recomputed from the batch it scheduled
    and the block tables it left, never from a counter the policy could have reached; against ``config``
    (a copy of the engine's, taken as it was built), else the engine's own."""
    config, bm = config or engine.config, engine.scheduler.block_manager
    tokens = sum(s.num_tokens for s in report.output.scheduled)
    if tokens > config.max_num_batched_tokens:
        return f"step {report.step} batched {tokens} tokens > max_num_batched_tokens {config.max_num_batched_tokens}"
    running = [s for g in engine.sequence_groups.values() for s in g.seqs if s.status is SequenceStatus.RUNNING]
    if len(running) > config.max_num_seqs:
        return f"step {report.step} left {len(running)} sequences running > max_num_seqs {config.max_num_seqs}"
    held = {b for table in bm.gpu_tables.values() for b in table}
    if len(held) > config.num_gpu_blocks or any(b >= config.num_gpu_blocks for b in held):
        return (
            f"step {report.step} left block tables that name {len(held)} GPU blocks, of a pool of "
            f"{config.num_gpu_blocks}"
        )
    for seq in running:
        table = bm.gpu_tables.get(seq.seq_id, ())
        if len(table) * config.block_size < seq.num_computed_tokens:
            return (
                f"step {report.step} left {seq.group.request_id} with {seq.num_computed_tokens} computed tokens in "
                f"{len(table)} blocks"
            )
    return None
