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

import gc
import math
from array import array
from collections import deque
from collections.abc import Mapping, Sequence, Set
from enum import Enum
from types import BuiltinFunctionType, FunctionType, MappingProxyType, MemberDescriptorType, MethodType, ModuleType

import numpy as np
import pytest
from helpers import req
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kvsched import AllocStatus, Engine, EngineConfig, PolicyError, Preemption, SimulatedExecutor, hookimpl
from kvsched.cluster import Cluster, FleetSpec, ReplicaGroup
from kvsched.core.sequence import SequenceStatus
from kvsched.core.view import GroupView
from kvsched.policies.vllm_default import VllmDefault
from kvsched.routers import hookimpl as router_hookimpl


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
    groups = list(policy.foreign._groups.values())
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


def _same_layout(cls: type) -> type:
    """A class of a plugin's own with ``cls``'s layout (the class that adds its slots: the same bases and
    ``__slots__``), which Python lets it assign to an object of ``cls``; its slot descriptors read the slots ``cls``
    hides."""
    solid = next(k for k in cls.__mro__ if vars(k).get("__slots__"))
    return type("Same", solid.__bases__, {"__slots__": vars(solid)["__slots__"]})


class _OwnBaseException(BaseException):
    """Neither an Exception nor SystemExit nor GeneratorExit."""


def _raise(exc: BaseException):
    raise exc


# name: (hook, act, what the step raises). Acts receive (policy, *hook arguments).
ACTS = {
    # 1: views of another engine
    "admit a foreign view": ("select_batch", lambda p, s: s.admit(_foreign(p, "WAITING")), PolicyError),
    "advance a foreign view": ("select_batch", lambda p, s: s.advance(_foreign(p, "RUNNING")), PolicyError),
    "swap in a foreign view": ("select_batch", lambda p, s: s.swap_in(_foreign(p, "SWAPPED")), PolicyError),
    "preempt a foreign view": ("select_batch", lambda p, s: s.preempt(_foreign(p, "RUNNING")), PolicyError),
    "ask the cache about a foreign view": (
        "select_batch",
        lambda p, s: s.cache.blocks_to_allocate(_foreign(p, "WAITING")),
        PolicyError,
    ),
    "pick a foreign victim": ("choose_preemption", lambda p, s, r: Preemption(_foreign(p, "RUNNING")), PolicyError),
    # 2: max_tokens that is not a positive integer
    "admit with max_tokens=NaN": (
        "select_batch",
        lambda p, s: s.admit(_first(s, "waiting"), max_tokens=math.nan),
        PolicyError,
    ),
    "advance with max_tokens=2.5": (
        "select_batch",
        lambda p, s: s.advance(_first(s, "running"), max_tokens=2.5),
        PolicyError,
    ),
    "admit with max_tokens=0": ("select_batch", lambda p, s: s.admit(_first(s, "waiting"), max_tokens=0), PolicyError),
    "admit with max_tokens=True": (
        "select_batch",
        lambda p, s: s.admit(_first(s, "waiting"), max_tokens=True),
        PolicyError,
    ),
    "swap in with max_tokens='8'": (
        "select_batch",
        lambda p, s: s.swap_in(_first(s, "swapped"), max_tokens="8"),
        PolicyError,
    ),
    "advance decodes with max_tokens=inf": (
        "select_batch",
        lambda p, s: s.advance_decodes(max_tokens=math.inf),
        PolicyError,
    ),
    # 3: writes to what the step hands out
    "zero the token counter": ("select_batch", lambda p, s: _setattr(s, "num_batched_tokens", 0), PolicyError),
    "zero the output's token counter": (
        "select_batch",
        lambda p, s: _setattr(s.output, "num_batched_tokens", 0),
        PolicyError,
    ),
    "zero the running-sequence count": ("select_batch", lambda p, s: _setattr(s, "num_running_seqs", 0), PolicyError),
    "rewind the clock": ("select_batch", lambda p, s: _setattr(s, "now", 0.0), PolicyError),
    "append to admitted": ("select_batch", lambda p, s: s.admitted.append(_any_view(s)), PolicyError),
    "write a view's status": (
        "select_batch",
        lambda p, s: _setattr(_any_view(s), "status", SequenceStatus.WAITING),
        PolicyError,
    ),
    # 3b: writes to the frozen objects a view reaches, past their frozen __setattr__ (issue 21)
    "raise the token budget through the config's __dict__": (
        "select_batch",
        lambda p, s: s.config.__dict__.update(max_num_batched_tokens=10**6),
        PolicyError,
    ),
    "raise the sequence budget with object.__setattr__": (
        "select_batch",
        lambda p, s: object.__setattr__(s.config, "max_num_seqs", 10**6),
        PolicyError,
    ),
    "shorten a request through its __dict__": (
        "select_batch",
        lambda p, s: _any_view(s).request.__dict__.update(output_len=1),
        PolicyError,
    ),
    "cap a request's tokens through its sampling's __dict__": (
        "can_allocate",
        lambda p, s, g: g.request.sampling.__dict__.update(max_tokens=1),
        PolicyError,
    ),
    "raise a priority with object.__setattr__": (
        "on_step",
        lambda p, r: object.__setattr__(next(iter(r.output.scheduled)).group.request, "priority", -9),
        PolicyError,
    ),
    # 4: a step kept after it was built
    "admit on a kept step": ("select_batch", lambda p, s: p.kept_step.admit(_first(s, "waiting")), PolicyError),
    "advance on a kept step in on_step": ("on_step", lambda p, r: p.kept_step.advance_running(), PolicyError),
    # 5: re-entrant calls
    "engine.step() inside select_batch": ("select_batch", lambda p, s: p.engine.step(), PolicyError),
    "engine.abort() inside select_batch": (
        "select_batch",
        lambda p, s: p.engine.abort(_any_view(s).request_id),
        PolicyError,
    ),
    "engine.add_request() inside select_batch": (
        "select_batch",
        lambda p, s: p.engine.add_request(req("late", 4, 2)),
        PolicyError,
    ),
    "engine.steady_run() inside select_batch": ("select_batch", lambda p, s: p.engine.steady_run(1e9), PolicyError),
    "engine.abort() inside on_step": (
        "on_step",
        lambda p, r: p.engine.abort(next(iter(p.engine._groups))),
        PolicyError,
    ),
    "advance the requester inside choose_preemption": (
        "choose_preemption",
        lambda p, s, r: (s.advance(r), Preemption(r))[1],
        PolicyError,
    ),
    "admit inside can_allocate": ("can_allocate", lambda p, s, g: (s.admit(g), AllocStatus.OK)[1], PolicyError),
    "a refusal caught by the policy": ("select_batch", _caught, PolicyError),
    # 6: exceptions after real work, BaseExceptions included
    "raise KeyError": ("select_batch", lambda p, s: {}["no-such-request"], PolicyError),
    "raise KeyboardInterrupt": ("select_batch", lambda p, s: _raise(KeyboardInterrupt()), KeyboardInterrupt),
    "raise SystemExit": ("select_batch", lambda p, s: _raise(SystemExit(3)), PolicyError),
    # a BaseException of the plugin's own escapes the hook call (inside vLLM: the mirror is given up)
    "raise a BaseException of its own": ("select_batch", lambda p, s: _raise(_OwnBaseException()), _OwnBaseException),
    "raise SystemExit(0) in on_step": ("on_step", lambda p, r: _raise(SystemExit(0)), PolicyError),
    "raise in can_allocate": ("can_allocate", lambda p, s, g: 1 / 0, PolicyError),
    "raise in on_step": ("on_step", lambda p, r: 1 / 0, PolicyError),
    # 7: the report is read-only
    "rewrite a finished status": (
        "on_step",
        lambda p, r: _setattr((r.finished or [p.engine._groups["r0"].view])[0], "status", SequenceStatus.WAITING),
        PolicyError,
    ),
    "shrink a batch entry": (
        "on_step",
        lambda p, r: _setattr(next(iter(r.output.scheduled)), "num_tokens", 0),
        PolicyError,
    ),
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

CONFIG = dict(
    block_size=4, num_gpu_blocks=14, num_cpu_blocks=12, watermark=0.0, max_num_batched_tokens=64, max_num_seqs=16
)


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
        [
            (
                g.request_id,
                g.status,
                g.num_generated_tokens,
                g.num_unfinished_seqs,
                g.first_scheduled_time,
                g.first_token_time,
                g.finish_time,
                g.num_recompute_preemptions,
                g.num_swap_preemptions,
                [(x.seq_id, x.status, x.num_tokens, x.num_computed_tokens, tuple(x.output)) for x in g.seqs],
            )
            for g in e._groups.values()
        ],
        {k: tuple(v) for k, v in bm.gpu_tables.items()},
        {k: tuple(v) for k, v in bm.cpu_tables.items()},
        tuple(bm.gpu.ref_counts),
        tuple(bm.cpu.ref_counts),
        tuple(bm.gpu._free),
        tuple(bm.cpu._free),
        tuple(bm.gpu.evictor),
        tuple(bm.cpu.evictor),
        tuple(bm.gpu.block_hash),
        s.num_running_seqs,
        e.num_steps,
        e.clock.now(),
        [g.request_id for g in e.finished],
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
        except (PolicyError, KeyboardInterrupt, SystemExit, _OwnBaseException) as exc:
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
        assert all(
            g.status
            in (SequenceStatus.FINISHED_STOPPED, SequenceStatus.FINISHED_LENGTH_CAPPED, SequenceStatus.FINISHED_IGNORED)
            for g in engine._groups.values()
        )
    assert [(g.request_id, g.status, g.finish_time) for g in armed.finished] == [
        (g.request_id, g.status, g.finish_time) for g in twin.finished
    ]
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
    assert play(
        act_name, CONFIG, SPECS, warmup, work_first=hook == "select_batch" and "with max_tokens" not in act_name
    ), act_name


def _first_step_with_a_swapped_group() -> int:
    engine = _engine(CONFIG, SPECS)
    while not engine.scheduler.swapped:
        engine.step()
    return engine.num_steps


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    act_name=st.sampled_from(sorted(ACTS)),
    warmup=st.integers(0, 12),
    work_first=st.booleans(),
    blocks=st.integers(10, 24),
    specs=st.lists(st.tuples(st.integers(1, 14), st.integers(1, 30), st.integers(1, 2)), min_size=2, max_size=7),
)
def test_random_hostile_acts_never_corrupt_the_engine(act_name, warmup, work_first, blocks, specs):
    fired = play(act_name, {**CONFIG, "num_gpu_blocks": blocks}, specs, warmup, work_first)
    event(f"fired: {fired}")


CONSTANTS = (
    int,
    float,
    complex,
    str,
    bytes,
    bool,
    type(None),
    Enum,
    type,
    ModuleType,
    FunctionType,
    BuiltinFunctionType,
    MethodType,
    property,
    range,
)  # values, and the class-level constants every engine shares (enum members, classes, code)
MUTABLE = (list, dict, set, bytearray, deque, array, np.ndarray)


def writable(obj) -> bool:
    """Whether ``obj`` has a path that writes it: a mutable container, an instance ``__dict__``, a slot whose
    descriptor is on its class (``type(obj).slot.__set__``, ``object.__setattr__``), or a property with a setter;
    a named tuple, a view, a ``mappingproxy`` has none."""
    if isinstance(obj, CONSTANTS):
        return False
    if any(isinstance(a, property) and a.fset is not None for klass in type(obj).__mro__ for a in vars(klass).values()):
        return True
    if isinstance(obj, MUTABLE):
        return not isinstance(obj, np.ndarray) or obj.flags.writeable
    if isinstance(obj, tuple):
        return False
    try:
        object.__getattribute__(obj, "__dict__")
        return True
    except AttributeError:
        pass
    return any(
        isinstance(klass.__dict__.get(slot), MemberDescriptorType)
        for klass in type(obj).__mro__
        for slot in getattr(klass, "__slots__", ())
    )


def engine_owned(engine, *aside) -> dict[int, object]:
    """Every writable object the engine (or a fleet) holds (what ``gc.get_referents`` finds from it), the plugin's
    own side (``engine.hooks``, or ``aside``) excepted: what no hook may reach."""
    seen, todo, owned = {id(a) for a in aside or (engine.hooks,)}, [engine], {}
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, CONSTANTS):
            continue
        seen.add(id(obj))
        if writable(obj):
            owned[id(obj)] = obj
        todo += gc.get_referents(obj)
    return owned


def reachable(root, depth: int = 7):
    """Every object a plugin reaches from ``root`` without importing anything: attributes (dunders such as
    ``__dict__`` included), ``__dict__`` entries, slots, mapping keys and values, the items of what it iterates;
    with the path that reached it. Methods and classes are not followed (code, not state)."""
    seen, todo = {}, [(root, "root", depth)]
    while todo:
        obj, path, left = todo.pop()
        if id(obj) in seen or left < 0:
            continue
        seen[id(obj)] = (obj, path)
        if isinstance(obj, CONSTANTS) or callable(obj):
            continue
        if isinstance(obj, (Mapping, MappingProxyType)):
            todo += [(v, f"{path}[{k!r}]", left - 1) for k, v in obj.items()] + [
                (k, f"{path}.keys()", left - 1) for k in obj
            ]
        elif isinstance(obj, (tuple, Sequence, Set, np.ndarray)):
            todo += [(item, f"{path}[{i}]", left - 1) for i, item in enumerate(obj)]
        for name in dir(obj):
            try:
                value = getattr(obj, name)
            except AttributeError:
                continue
            if value is not getattr(type(obj), name, None):  # class-level data is no engine state
                todo.append((value, f"{path}.{name}", left - 1))
        for klass in type(obj).__mro__:
            for slot in getattr(klass, "__slots__", ()):
                if hasattr(obj, slot):
                    todo.append((getattr(obj, slot), f"{path}.{slot}", left - 1))
    return seen.values()


class Looks(VllmDefault):
    """vllm-default that keeps what every hook is handed, deciding admission itself (so that ``can_allocate`` is
    called) and holding prompts back now and then (notes with numbers)."""

    name = "looks"

    def __init__(self) -> None:
        super().__init__()
        self.handed = []

    @hookimpl
    def select_batch(self, step):
        super().select_batch(step)
        if step.waiting:
            step.hold_back("looking", waited_s=0.5, limit_s=1)
        self.handed.append(("select_batch", step))

    @hookimpl
    def choose_preemption(self, step, requester):
        self.handed.append(("choose_preemption", (step, requester)))

    @hookimpl
    def can_allocate(self, step, group):
        self.handed.append(("can_allocate", (step, group)))
        return step.cache.can_allocate(group)

    @hookimpl
    def on_step(self, report):
        self.handed.append(("on_step", report))


def assert_nothing_writable_of(engine: Engine, handed) -> set[str]:
    """No object reachable from what the hooks were ``handed`` is writable; none of the engine's own, above all."""
    owned, kinds = engine_owned(engine), set()
    for hook, args in handed:
        kinds.add(hook)
        for obj, path in reachable(args):
            assert id(obj) not in owned, f"{hook}: {path} is the engine's own {type(obj).__name__}"
            assert not writable(obj), f"{hook}: {path} is a writable {type(obj).__name__}"
    return kinds


@pytest.mark.parametrize(
    "mechanics", [{}, {"vllm_engine": "v1", "enable_prefix_caching": True, "preemption_mode": "recompute"}]
)
def test_nothing_a_hook_is_handed_leads_to_mutable_engine_state(mechanics):
    """Walked like a plugin would (``__dict__``, slots, mappings, sequences), from every hook's arguments after each
    step: the config, the requests and their sampling parameters, the decision notes, all read-only copies or views."""
    engine = Engine(EngineConfig(**CONFIG, **mechanics), Looks, SimulatedExecutor())
    for i, (prompt, output, n) in enumerate(SPECS):
        engine.add_request(req(f"r{i}", prompt, output, n=n, session_id=f"s{i % 2}", slo_class="batch"))
    kinds = set()
    for _ in range(14):
        engine.step()
        handed = engine.hooks.policy.handed
        kinds |= assert_nothing_writable_of(engine, handed)
        handed.clear()
    assert kinds == {"select_batch", "choose_preemption", "can_allocate", "on_step"}
    engine.run()


def test_a_steady_run_hands_its_observers_nothing_writable():
    """``StepRun`` (``run.notes`` once was the scheduler's own list of the steady step's notes)."""
    runs = []

    class Runs:
        def __call__(self, report):
            pass

        def on_steps(self, run):
            runs.append(("on_steps", run))

    engine = Engine(EngineConfig(block_size=4, num_gpu_blocks=60), "vllm-default", SimulatedExecutor())
    engine.run([req(f"r{i}", 40, 30 + 7 * i, arrival=0.01 * i) for i in range(12)], on_step=Runs())
    assert runs and any(run.notes.decisions for _, run in runs)
    engine.add_request(req("late", 4, 2))  # an engine with state to protect
    assert_nothing_writable_of(engine, runs)


def test_an_observer_cannot_clear_the_notes_a_steady_step_repeats():
    """``StepRun.notes`` once handed observers the scheduler's own list: clearing it changed the decision notes of
    every later repeat of the step."""

    class Clears:
        def __call__(self, report):
            pass

        def on_steps(self, run):
            run.notes.decisions.clear()

    engine = Engine(EngineConfig(block_size=4, num_gpu_blocks=60), "vllm-default", SimulatedExecutor())
    with pytest.raises(AttributeError):
        engine.run([req(f"r{i}", 40, 30 + 7 * i, arrival=0.01 * i) for i in range(12)], on_step=Clears())


def behind_slots(handed) -> tuple:
    """What a plugin reads from the slots of what it is handed, hidden ones included, by switching each object's
    ``__class__`` to a class of its own with the same layout (``_same_layout``), and back: nothing where the switch
    is refused."""
    found = []
    for obj in handed if isinstance(handed, tuple) else (handed,):
        if isinstance(obj, tuple):
            found += behind_slots(obj)
            continue
        cls = type(obj)
        slots = [s for klass in cls.__mro__ for s in vars(klass).get("__slots__", ())]
        if not slots:
            continue
        try:
            obj.__class__ = _same_layout(cls)
        except TypeError:  # a layout Python does not let it assign, or a view that keeps its class
            continue
        try:
            found += [getattr(obj, s) for s in slots if hasattr(obj, s)]
        finally:
            obj.__class__ = cls
    return tuple(found)  # the walk's own container, not what it reached


class LooksAround:
    """A router that walks what each of its hooks is handed, as the hook runs (a view refuses every read after its
    call), checking that nothing it reaches is writable or the fleet's own; it routes round-robin."""

    name = "looks-around"

    def __init__(self) -> None:
        self.cluster, self.kinds, self.walked = None, set(), 0

    def look(self, hook: str, args) -> None:
        owned = engine_owned(self.cluster, self.cluster.router)
        self.kinds.add(hook)
        for obj, path in [*reachable(args), *reachable(behind_slots(args))]:
            self.walked += 1
            assert id(obj) not in owned, f"{hook}: {path} is the fleet's own {type(obj).__name__}"
            assert not writable(obj), f"{hook}: {path} is a writable {type(obj).__name__}"

    @router_hookimpl
    def route_request(self, request, replicas):
        self.look("route_request", (request, replicas))
        return replicas[self.walked % len(replicas)]

    @router_hookimpl
    def on_routed(self, request, replica):
        self.look("on_routed", (request, replica))

    @router_hookimpl
    def on_finished(self, request, replica):
        self.look("on_finished", (request, replica))


@pytest.mark.parametrize("roles", [("mixed",), ("prefill", "decode")])
def test_nothing_a_router_hook_is_handed_leads_to_mutable_fleet_state(roles):
    """The reachability walk above, from every router hook's arguments (the request, the replica views, what a view
    reads: reports, cached prefixes, the sampling parameters) and from what their slots hold, read by switching their
    class to one with the same slots: read-only views and copies, numbers and names only, in a co-located fleet and
    under P/D. (A router was once handed the engine's own Request; a view's call was writable, and its hidden slot
    held the replica itself.)"""
    looks = LooksAround()
    settings = {**CONFIG, "enable_prefix_caching": True, "num_gpu_blocks": 64}
    cluster = Cluster(
        FleetSpec(
            replicas=[ReplicaGroup(count=2, role=role, settings=settings) for role in roles],
            router=looks,
            staleness_s=0.01,
        )
    )
    looks.cluster = cluster
    cluster.run(
        [
            req(f"r{i}", prompt, output, arrival=0.002 * i, session_id=f"s{i % 2}")
            for i, (prompt, output, _) in enumerate(SPECS)
        ]
    )
    assert looks.kinds == {"route_request", "on_routed", "on_finished"} and looks.walked > 100


# What a select_batch hook reads from the slots of what it is handed, hidden ones included (``behind_slots``): the
# engine's SequenceGroup, StepState, queue and block manager while the views kept them in hidden slots.
UNWRAPS = {
    "a request's view": lambda step: behind_slots(_any_view(step)),
    "the step": lambda step: [getattr(x, "bm", x) for x in behind_slots(step)],  # a StepState: its block manager
    "the waiting queue": lambda step: behind_slots(step.waiting),
    "the cache view": lambda step: behind_slots(step.cache),
}


@pytest.mark.parametrize("unwrap", list(UNWRAPS.values()), ids=list(UNWRAPS))
def test_a_hook_cannot_unwrap_what_it_is_handed_by_switching_its_class(unwrap):
    """A policy switches the ``__class__`` of a view it is handed to a class of its own with the same layout, which
    Python allows, and reads the hidden slot through that class's descriptor: it must find none of the engine's own
    (a refused switch finds nothing). The core's views hold nothing of what they show (core/view.py: a request's view
    once kept its group in a hidden slot), the routers' views only numbers and names (routers/view.py)."""
    found = []

    class Unwraps(VllmDefault):
        name = "unwraps"

        @hookimpl
        def select_batch(self, step):
            if step.waiting or step.running:
                found.extend(unwrap(step))
            super().select_batch(step)

    engine = Engine(EngineConfig(**CONFIG), Unwraps, SimulatedExecutor(steady_steps=False))
    for i, (prompt, output, n) in enumerate(SPECS):
        engine.add_request(req(f"r{i}", prompt, output, n=n))
    for _ in range(3):
        engine.step()
    owned = engine_owned(engine)
    assert found and not [type(x).__name__ for x in found if id(x) in owned]


def test_what_a_view_shows_is_let_go_with_the_view():
    """The core finds what a view shows in a table of its own (core/view.py): an entry must go when its view does (the
    cache view's block manager, a report's output), and a step's queues when the step closes."""
    import weakref

    from kvsched.core import view

    engine = Engine(EngineConfig(**CONFIG), "vllm-default", SimulatedExecutor())
    for i, (prompt, output, n) in enumerate(SPECS):
        engine.add_request(req(f"r{i}", prompt, output, n=n))
    outputs = []
    for _ in range(3):
        outputs.append(engine.step().output)
    bm = view.shown(engine.cache)
    assert bm is engine.scheduler.block_manager and view.shown(engine.waiting) == engine.scheduler.waiting
    kept = [weakref.ref(bm), *(weakref.ref(view.shown(o)) for o in outputs)]
    del engine, bm, outputs
    gc.collect()
    assert not [r() for r in kept if r() is not None]


def test_a_view_with_no_entry_says_it_shows_nothing():
    """Every read of what a view shows misses the core's table the same way (core/view.py ``SHOWN``, which the step
    builder's hot reads index at C speed): a queue kept past its step, or a builder the core did not make, raises
    one ReferenceError saying so, never a KeyError nor an answer."""
    from kvsched.core.step import StepBuilder

    kept = []

    class Keeps(VllmDefault):
        name = "keeps"

        @hookimpl
        def select_batch(self, step):
            kept.append(step.waiting)
            super().select_batch(step)

    engine = Engine(EngineConfig(**CONFIG), Keeps, SimulatedExecutor())
    for i, (prompt, output, n) in enumerate(SPECS):
        engine.add_request(req(f"r{i}", prompt, output, n=n))
    engine.step()
    assert len(kept) == 1 and type(kept[0]).__name__ == "QueueView"  # the queue was not empty
    with pytest.raises(ReferenceError, match=r"^this \w+ shows nothing: one a step handed out is valid only during"):
        len(kept[0])
    forged = object.__new__(StepBuilder)
    for read in (
        lambda: forged.remaining_tokens,
        lambda: forged.was_touched(engine.groups["r0"]),
        lambda: forged.advance(engine.groups["r0"]),
        lambda: forged.now,
    ):
        with pytest.raises(ReferenceError, match=r"^this \w+ shows nothing"):
            read()


@pytest.mark.parametrize("retain", [True, False], ids=["taken", "not retained"])
def test_a_request_view_shows_nothing_once_its_engine_let_it_go(retain):
    """A request's view finds its group in the core's table (core/view.py), not in a slot of its own. The engine lets
    a request go when it is taken (``take_finished``) or, not retained, retired; its report still shows it, and from
    the engine's next step its view shows nothing, a policy that kept it is refused, and the table keeps no let-go
    group alive, nor any of an engine dropped with requests unfinished."""
    import weakref

    from kvsched.core import view

    kept = []

    class AdmitsWhatItKept(VllmDefault):
        name = "admits-what-it-kept"

        @hookimpl
        def select_batch(self, step):
            if kept:
                step.admit(kept[0])
            super().select_batch(step)

    engine = Engine(EngineConfig(**CONFIG), AdmitsWhatItKept, SimulatedExecutor(), retain_finished=retain)
    for i, (prompt, output, n) in enumerate(SPECS):
        engine.add_request(req(f"r{i}", prompt, output, n=n))
    report = engine.step()
    while not report.finished:
        report = engine.step()
    views, groups = report.finished, [weakref.ref(view.group_of(v)) for v in report.finished]
    del report  # its output holds the groups it scheduled
    assert [v.request_id for v in views] == [g().request_id for g in groups]  # shown while its report is read
    if retain:
        engine.step()
        assert [v.status.is_finished for v in views] == [True] * len(views)  # retained: shown
        assert [g.view for g in engine.take_finished()] == list(views)
    engine.step()
    with pytest.raises(KeyError, match="<a GroupView that shows nothing>"):
        _ = views[0].request_id
    assert view.group_of(views[0]) is None and repr(views[0]) == "<a GroupView that shows nothing>"
    gc.collect()
    assert not [g() for g in groups if g() is not None]  # nothing keeps them, the table least of all
    kept.append(views[0])
    with pytest.raises(PolicyError, match="admit: <a GroupView that shows nothing> is not a request of this engine"):
        engine.step()
    dropped = Engine(EngineConfig(**CONFIG), "vllm-default", SimulatedExecutor(), retain_finished=retain)
    for i, (prompt, output, n) in enumerate(SPECS):
        dropped.add_request(req(f"r{i}", prompt, output, n=n))
    for _ in range(3):
        dropped.step()
    live = [weakref.ref(g) for g in dropped.sequence_groups.values()]
    live_views = [g().view for g in live]
    assert live and [view.group_of(v) for v in live_views] == [g() for g in live]
    del dropped
    gc.collect()
    assert not [g() for g in live if g() is not None] and not [v for v in live_views if view.group_of(v)]
