"""A hostile plugin cannot corrupt the engine: every misuse is a PolicyError naming the plugin and
the hook, the step it was building leaves no trace, and the engine then runs to completion.

``Hostile`` behaves like vllm-default until it is armed with one act from ``ACTS``: foreign,
stale or forged handles, bad arguments, writes to what it was handed, re-entrant calls, hook
answers of the wrong type, exceptions (KeyboardInterrupt and SystemExit included) after real
work. Each example runs the armed engine in lockstep with an unarmed twin: the failed step must
leave the armed engine exactly as it was (block tables, ref counts, free lists, queues,
statuses, clock), or, for an ``on_step`` act (run once the step is done), exactly as the twin
after that step; a second engine whose views are handed over must not change at all; the audit
must be clean; and both engines must then finish every request identically, with no block held.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import Enum

import pytest
from helpers import req
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from kvsched import AllocStatus, Engine, EngineConfig, PolicyError, Preemption, SimulatedExecutor, hookimpl
from kvsched.core.sequence import SequenceStatus
from kvsched.core.view import GroupView
from kvsched.policies.vllm_default import VllmDefault


class Hostile(VllmDefault):
    """vllm-default, plus one hostile act in one hook once armed (``arm``)."""

    name = "hostile"

    def __init__(self) -> None:
        super().__init__()
        self.act, self.hook, self.work_first = None, None, False
        self.engine = self.foreign = self.kept_step = None
        self.fired = False

    def arm(self, hook: str, act, work_first: bool) -> None:
        self.hook, self.act, self.work_first = hook, act, work_first

    def _fire(self, hook: str, *args):
        if self.hook != hook or self.act is None:
            return None
        self.fired, act, self.act = True, self.act, None  # one shot, even if the act raises
        return act(self, *args)

    @hookimpl
    def select_batch(self, step):
        if self.hook == "select_batch" and self.act is not None:
            if self.work_first:  # real allocations that the rollback must undo
                super().select_batch(step)
            return self._fire("select_batch", step)
        super().select_batch(step)
        self.kept_step = step
        return True

    @hookimpl
    def choose_preemption(self, step, requester):
        return self._fire("choose_preemption", step, requester)

    @hookimpl
    def can_allocate(self, step, group):
        return self._fire("can_allocate", step, group)

    @hookimpl
    def on_step(self, report):
        self._fire("on_step", report)


def _foreign(policy, status: str) -> GroupView:
    """A view of the other engine, in the queue the operation expects when it has one (the real attack)."""
    groups = list(policy.foreign.groups.values())
    return next((g.view for g in groups if g.status.name == status), groups[0].view)


def _first(step, queue: str) -> GroupView:
    """The first group of ``queue`` not yet touched in this step: a handle the operation would accept."""
    return next(g for g in getattr(step, queue) if not step.was_touched(g))


def _any_view(step) -> GroupView:
    return next(iter(step.running or step.waiting or step.swapped))


def _caught(policy, step):
    """Swallow a refusal and carry on as if nothing happened: the step must still fail."""
    try:
        step.admit(None)
    except PolicyError:
        pass


def _setattr(obj, name, value):
    setattr(obj, name, value)


def _raise(exc: BaseException):
    raise exc


# name: (hook, act, what the step raises). Acts receive (policy, *hook arguments).
ACTS = {
    # 1: views of another engine
    "admit a foreign view": ("select_batch", lambda p, s: s.admit(_foreign(p, "WAITING")), PolicyError),
    "advance a foreign view": ("select_batch", lambda p, s: s.advance(_foreign(p, "RUNNING")), PolicyError),
    "swap in a foreign view": ("select_batch", lambda p, s: s.swap_in(_foreign(p, "SWAPPED")), PolicyError),
    "preempt a foreign view": ("select_batch", lambda p, s: s.preempt(_foreign(p, "RUNNING")), PolicyError),
    "ask the cache about a foreign view": ("select_batch", lambda p, s: s.cache.blocks_to_allocate(_foreign(p, "WAITING")), PolicyError),
    "pick a foreign victim": ("choose_preemption", lambda p, s, r: Preemption(_foreign(p, "RUNNING")), PolicyError),
    # 2: max_tokens that is not a positive integer
    "admit with max_tokens=NaN": ("select_batch", lambda p, s: s.admit(_first(s, "waiting"), max_tokens=math.nan), PolicyError),
    "advance with max_tokens=2.5": ("select_batch", lambda p, s: s.advance(_first(s, "running"), max_tokens=2.5), PolicyError),
    "admit with max_tokens=0": ("select_batch", lambda p, s: s.admit(_first(s, "waiting"), max_tokens=0), PolicyError),
    "admit with max_tokens=True": ("select_batch", lambda p, s: s.admit(_first(s, "waiting"), max_tokens=True), PolicyError),
    "swap in with max_tokens='8'": ("select_batch", lambda p, s: s.swap_in(_first(s, "swapped"), max_tokens="8"), PolicyError),
    "advance decodes with max_tokens=inf": ("select_batch", lambda p, s: s.advance_decodes(max_tokens=math.inf), PolicyError),
    # 3: writes to what the step hands out
    "zero the token counter": ("select_batch", lambda p, s: _setattr(s, "num_batched_tokens", 0), PolicyError),
    "zero the output's token counter": ("select_batch", lambda p, s: _setattr(s.output, "num_batched_tokens", 0), PolicyError),
    "zero the running-sequence count": ("select_batch", lambda p, s: _setattr(s, "num_running_seqs", 0), PolicyError),
    "rewind the clock": ("select_batch", lambda p, s: _setattr(s, "now", 0.0), PolicyError),
    "append to admitted": ("select_batch", lambda p, s: s.admitted.append(_any_view(s)), PolicyError),
    "write a view's status": ("select_batch", lambda p, s: _setattr(_any_view(s), "status", SequenceStatus.WAITING), PolicyError),
    # 4: a step kept after it was built
    "admit on a kept step": ("select_batch", lambda p, s: p.kept_step.admit(_first(s, "waiting")), PolicyError),
    "advance on a kept step in on_step": ("on_step", lambda p, r: p.kept_step.advance_running(), PolicyError),
    # 5: re-entrant calls
    "engine.step() inside select_batch": ("select_batch", lambda p, s: p.engine.step(), PolicyError),
    "engine.abort() inside select_batch": ("select_batch", lambda p, s: p.engine.abort(_any_view(s).request_id), PolicyError),
    "engine.add_request() inside select_batch": ("select_batch", lambda p, s: p.engine.add_request(req("late", 4, 2)), PolicyError),
    "engine.abort() inside on_step": ("on_step", lambda p, r: p.engine.abort(next(iter(p.engine.groups))), PolicyError),
    "advance the requester inside choose_preemption": ("choose_preemption", lambda p, s, r: (s.advance(r), Preemption(r))[1], PolicyError),
    "admit inside can_allocate": ("can_allocate", lambda p, s, g: (s.admit(g), AllocStatus.OK)[1], PolicyError),
    "a refusal caught by the policy": ("select_batch", _caught, PolicyError),
    # 6: exceptions after real work, BaseExceptions included
    "raise KeyError": ("select_batch", lambda p, s: {}["no-such-request"], PolicyError),
    "raise KeyboardInterrupt": ("select_batch", lambda p, s: _raise(KeyboardInterrupt()), KeyboardInterrupt),
    "raise SystemExit": ("select_batch", lambda p, s: _raise(SystemExit(3)), SystemExit),
    "raise in can_allocate": ("can_allocate", lambda p, s, g: 1 / 0, PolicyError),
    "raise in on_step": ("on_step", lambda p, r: 1 / 0, PolicyError),
    # 7: the report is read-only
    "rewrite a finished status": ("on_step", lambda p, r: _setattr((r.finished or [p.engine.groups["r0"].view])[0], "status", SequenceStatus.WAITING), PolicyError),
    "shrink a batch entry": ("on_step", lambda p, r: _setattr(next(iter(r.output.scheduled)), "num_tokens", 0), PolicyError),
    "append a block copy": ("on_step", lambda p, r: r.output.blocks_to_copy.append((0, 10**9)), PolicyError),
    # 8: private state one attribute away
    "pop a request through a queue view": ("select_batch", lambda p, s: s.waiting._groups.pop(), PolicyError),
    "reach the block manager through the cache": ("select_batch", lambda p, s: s.cache._bm.gpu.allocate(), PolicyError),
    "unwrap a view": ("select_batch", lambda p, s: _any_view(s)._group, PolicyError),
    # 15: answers of the wrong type, and huge ones
    "preempt with mode 'swap'": ("select_batch", lambda p, s: s.preempt(_first(s, "running"), "swap"), PolicyError),
    "a victim with mode 1": ("choose_preemption", lambda p, s, r: Preemption(r, 1), PolicyError),
    "a million-element victim": ("choose_preemption", lambda p, s, r: [0] * 10**6, PolicyError),
    "can_allocate answers True": ("can_allocate", lambda p, s, g: True, PolicyError),
    "admit a forged view": ("select_batch", lambda p, s: s.admit(GroupView.__new__(GroupView)), PolicyError),
    "admit None": ("select_batch", lambda p, s: s.admit(None), PolicyError),
}

CONFIG = dict(block_size=4, num_gpu_blocks=14, num_cpu_blocks=12, watermark=0.0, max_num_batched_tokens=64, max_num_seqs=16)


def _engine(config: dict, specs) -> Engine:
    engine = Engine(EngineConfig(**config), Hostile, SimulatedExecutor())
    for i, (prompt, output, n) in enumerate(specs):
        engine.add_request(req(f"r{i}", prompt, output, n=n))
    engine.hooks.policy.engine = engine
    return engine


def snapshot(e: Engine):
    """Everything a step can change: queues, statuses and tokens, tables, ref counts, free lists, counters."""
    s, bm = e.scheduler, e.scheduler.block_manager
    return (
        [[g.request_id for g in q] for q in (s.waiting, s.running, s.swapped)],
        [(g.request_id, g.status, g.num_generated_tokens, g.num_unfinished_seqs, g.first_scheduled_time, g.first_token_time,
          g.finish_time, g.num_recompute_preemptions, g.num_swap_preemptions,
          [(x.seq_id, x.status, x.num_tokens, x.num_computed_tokens, tuple(x.output)) for x in g.seqs]) for g in e.groups.values()],
        {k: tuple(v) for k, v in bm.gpu_tables.items()}, {k: tuple(v) for k, v in bm.cpu_tables.items()},
        tuple(bm.gpu.ref_counts), tuple(bm.cpu.ref_counts), tuple(bm.gpu._free), tuple(bm.cpu._free),
        tuple(bm.gpu.evictor), tuple(bm.cpu.evictor), dict(bm.gpu.block_hash),
        s.num_running_seqs, e.num_steps, e.clock.now(), [g.request_id for g in e.finished],
    )


def play(act_name: str, config: dict, specs, warmup: int, work_first: bool) -> bool:
    """Run the armed engine beside its twin; check the failed step and the rest. True if the act fired."""
    hook, act, expected = ACTS[act_name]
    armed, twin, foreign = _engine(config, specs), _engine(config, specs), _engine(config, specs)
    for _ in range(3):
        foreign.step()
    armed.hooks.policy.foreign = foreign
    before_foreign = snapshot(foreign)
    fired = False
    for step in range(400):
        if not armed.has_unfinished():
            break
        if step == warmup:
            armed.hooks.policy.arm(hook, act, work_first)
        before = snapshot(armed)
        try:
            armed.step()
        except (PolicyError, KeyboardInterrupt, SystemExit) as exc:
            assert armed.hooks.policy.fired and not fired, f"{act_name}: {exc!r}"
            fired = True
            assert isinstance(exc, expected), f"{act_name}: {exc!r}"
            if isinstance(exc, PolicyError):
                assert exc.policy == "hostile" and exc.hook == hook, str(exc)
                assert str(exc).startswith(f"policy 'hostile' in {hook}: ") and len(str(exc)) < 600, str(exc)
            if hook == "on_step":  # the step itself stands; the observer left no trace in it
                twin.step()
                assert snapshot(armed) == snapshot(twin), act_name
            else:
                assert snapshot(armed) == before, act_name
            assert armed.scheduler.audit() == [] and armed.hooks.in_hook is None
            continue
        assert not (armed.hooks.policy.fired and not fired), f"{act_name} fired without an error"
        twin.step()
        assert snapshot(armed) == snapshot(twin), f"{act_name}: the engines diverged at step {step}"
    assert snapshot(foreign) == before_foreign, f"{act_name} changed the other engine"
    for engine in (armed, twin, foreign):
        engine.run()
        assert engine.leaked_blocks == 0 and engine.scheduler.audit() == []
        assert all(g.status in (SequenceStatus.FINISHED_STOPPED, SequenceStatus.FINISHED_LENGTH_CAPPED, SequenceStatus.FINISHED_IGNORED)
                   for g in engine.groups.values())
    assert [(g.request_id, g.status, g.finish_time) for g in armed.finished] == [(g.request_id, g.status, g.finish_time) for g in twin.finished]
    return fired


SPECS = [(6, 24, 1), (9, 20, 2), (5, 28, 1), (12, 16, 1), (7, 22, 2), (4, 30, 1), (10, 18, 1), (8, 26, 1)]


@pytest.mark.parametrize("act_name", list(ACTS))
def test_each_hostile_act_is_refused_and_leaves_no_trace(act_name):
    hook = ACTS[act_name][0]
    # Arm it where it bites: admissions in the first step, a swapped group once there is one,
    # otherwise once requests run; real work first, except where it would take the target.
    warmup = 0 if hook == "can_allocate" or act_name.startswith(("admit ", "raise", "a refusal")) else 2
    if "kept step" in act_name:
        warmup = 1
    if act_name.startswith("swap in"):
        warmup = _first_step_with_a_swapped_group()
    assert play(act_name, CONFIG, SPECS, warmup, work_first=hook == "select_batch" and "with max_tokens" not in act_name), act_name


def _first_step_with_a_swapped_group() -> int:
    engine = _engine(CONFIG, SPECS)
    while not engine.scheduler.swapped:
        engine.step()
    return engine.num_steps


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(act_name=st.sampled_from(sorted(ACTS)), warmup=st.integers(0, 12), work_first=st.booleans(),
       blocks=st.integers(10, 24), specs=st.lists(st.tuples(st.integers(1, 14), st.integers(1, 30), st.integers(1, 2)), min_size=2, max_size=7))
def test_random_hostile_acts_never_corrupt_the_engine(act_name, warmup, work_first, blocks, specs):
    fired = play(act_name, {**CONFIG, "num_gpu_blocks": blocks}, specs, warmup, work_first)
    event(f"fired: {fired}")


def _reachable(root, depth: int = 4):
    """Every object reachable from ``root`` through attributes (as a plugin would type them, dunders
    aside) and through the items of what it can iterate, with the path that reached it."""
    seen, todo = {}, [(root, "root", depth)]
    while todo:
        obj, path, left = todo.pop()
        if id(obj) in seen or left < 0:
            continue
        seen[id(obj)] = (obj, path)
        if isinstance(obj, (int, float, str, bool, type(None), Enum, BaseModel)) or callable(obj):
            continue  # leaves: values, frozen pydantic models, methods (not followed to __self__)
        if isinstance(obj, (tuple, Sequence)):
            todo += [(item, f"{path}[{i}]", left - 1) for i, item in enumerate(list(obj)[:3])]
        for name in dir(obj):
            value = getattr(obj, name)
            if not name.startswith("__") and value is not getattr(type(obj), name, None):  # class-level data is no engine state
                todo.append((value, f"{path}.{name}", left - 1))
    return seen.values()


IMMUTABLE = (int, float, str, bool, type(None), Enum, BaseModel, tuple, frozenset)


def test_nothing_a_hook_is_handed_leads_to_mutable_engine_state():
    from kvsched import CacheView, OutputView, QueueView, StepBuilder
    from kvsched.core.view import BatchView

    handed = []

    class Looks(VllmDefault):
        name = "looks"

        @hookimpl
        def select_batch(self, step):
            super().select_batch(step)
            handed.append(step)

        @hookimpl
        def on_step(self, report):
            handed.append(report)

    engine = Engine(EngineConfig(**CONFIG), Looks, SimulatedExecutor())
    for i, (prompt, output, n) in enumerate(SPECS):
        engine.add_request(req(f"r{i}", prompt, output, n=n))
    for _ in range(12):
        engine.step()
        step, report = handed[-2:]
        views = (GroupView, QueueView, BatchView, CacheView, OutputView, StepBuilder)
        for obj, path in [*_reachable(step), *_reachable(report)]:
            assert isinstance(obj, IMMUTABLE + views) or callable(obj), f"{path} is a {type(obj).__name__}"
            for name in (n for n in dir(obj) if not n.startswith("__") and not isinstance(obj, IMMUTABLE)):
                with pytest.raises(AttributeError):
                    setattr(obj, name, 0)
        assert all(not hasattr(v, "_group") and not hasattr(v, "_groups") and not hasattr(v, "_bm") and not hasattr(v, "_state")
                   for v in (step, step.waiting, step.cache, report.output, report.output.scheduled, *step.running))
