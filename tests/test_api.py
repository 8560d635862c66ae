"""One public API: every name comes from ``kvsched``, is documented in docs/api.md, and gives an
outside program the read access it needs without touching private attributes."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import req, unit_engine

import kvsched
from kvsched import Engine, EngineConfig, GroupView, QueueView, Request, SimulatedExecutor, VirtualClock, hookimpl

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_every_public_name_imports_and_is_documented():
    text = (DOCS / "api.md").read_text()
    documented = set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)[`(]", text))
    for name in kvsched.__all__:
        assert getattr(kvsched, name) is not None
        assert name in documented, f"docs/api.md does not list {name}"
    with pytest.raises(AttributeError):
        kvsched.NoSuchName  # noqa: B018


def test_importing_kvsched_loads_no_engine_until_a_name_is_used():
    code = (
        "import sys, kvsched; print('kvsched.core.engine' in sys.modules); kvsched.Engine; "
        "print('kvsched.core.engine' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True"]


def test_queues_in_order_outside_a_step():
    engine = unit_engine(max_num_seqs=2)
    for rid in "abcd":
        engine.add_request(req(rid, 4, 3))
    assert [v.request_id for v in engine.waiting] == ["a", "b", "c", "d"]
    engine.step()
    waiting, running = engine.waiting, engine.running
    assert isinstance(running, QueueView) and all(isinstance(v, GroupView) for v in running)
    assert [v.request_id for v in running] == ["a", "b"] and [v.request_id for v in waiting] == ["c", "d"]
    engine.step()
    assert [v.request_id for v in running] == ["a", "b"]  # a snapshot: the next step does not change it
    assert not hasattr(running[0], "__dict__")  # a view has no writable state


def test_free_and_cached_blocks_per_device():
    engine = unit_engine(enable_prefix_caching=True, num_gpu_blocks=16, num_cpu_blocks=8)
    assert (engine.cache.num_free_gpu_blocks, engine.cache.num_free_cpu_blocks, engine.cache.num_cached_gpu_blocks) == (
        16,
        8,
        0,
    )
    engine.add_request(
        Request(request_id="a", prompt_token_ids=tuple(range(12)), output_len=2, sampling={"max_tokens": 2})
    )
    engine.step()
    assert engine.cache.num_free_gpu_blocks == 16 - 3  # 12 prompt tokens (+1 sampled) in blocks of 4
    engine.run()
    assert engine.cache.num_free_gpu_blocks == 16
    assert engine.cache.num_cached_gpu_blocks == 3  # its full blocks stay cached, and count as free


def test_the_output_lists_the_groups_swapped_in():
    engine = unit_engine(num_gpu_blocks=6, preemption_mode="swap")
    for rid in "abc":
        engine.add_request(req(rid, 4, 12))
    swapped_in, swapped_out, victims = [], [], []
    engine.run(
        on_step=lambda r: (
            swapped_in.extend(g.request_id for g in r.output.swapped_in),
            swapped_out.extend(g.request_id for g, _ in r.output.preempted),  # (group, mode) pairs, unpacked
            victims.extend(r.output.preempted),
        )
    )
    assert swapped_out and sorted(swapped_in) == sorted(swapped_out)
    assert all(v._fields == ("group", "mode") and v == (v.group, v.mode) for v in victims)  # or named
    assert all(isinstance(v.group, GroupView) and v.mode is kvsched.PreemptionMode.SWAP for v in victims)


def test_a_prefix_hit_reports_the_full_prompt_next_to_its_uncached_part():
    engine = unit_engine(enable_prefix_caching=True)
    prompt = tuple(range(20))
    engine.add_request(Request(request_id="first", prompt_token_ids=prompt, output_len=1, sampling={"max_tokens": 1}))
    engine.run()
    engine.add_request(
        Request(request_id="second", prompt_token_ids=prompt + (99,), output_len=1, sampling={"max_tokens": 1})
    )
    (entry,) = engine.step().output.scheduled
    assert entry.is_prefill and entry.num_cached_tokens == 20 and entry.num_tokens == 1
    assert entry.num_cached_tokens + entry.num_tokens == engine._groups["second"].view.prompt_len


def test_a_caller_drives_the_clock():
    clock = VirtualClock()
    engine = Engine(EngineConfig(), "fcfs", SimulatedExecutor(), clock=clock)
    clock.set(5.0)
    assert engine.now == 5.0
    engine.add_request(req("a", 8, 2, arrival=5.0))
    engine.step()
    assert engine.now > 5.0 and engine.clock is clock
    with pytest.raises(ValueError, match="cannot be set"):
        clock.set(1.0)
    with pytest.raises(ValueError):
        clock.set(float("nan"))


def test_the_simulator_takes_the_engine_block_size():
    assert Engine(EngineConfig(block_size=8), "fcfs", SimulatedExecutor()).executor.block_size == 8
    with pytest.raises(ValueError, match="block_size"):
        Engine(EngineConfig(block_size=8), "fcfs", SimulatedExecutor(block_size=16))


def test_a_policy_written_against_the_public_api_runs():
    from kvsched import Outcome

    class NewestFirst:
        @hookimpl
        def select_batch(self, step):
            step.advance_running()
            for group in reversed(step.waiting):
                if step.admit(group) in (Outcome.LATER, Outcome.BUDGET):
                    break

    engine = Engine(EngineConfig(max_num_seqs=1, audit_every_step=True), NewestFirst, SimulatedExecutor())
    for rid in "abc":
        engine.add_request(req(rid, 8, 2))
    assert [g.request_id for g in engine.run()] == ["c", "b", "a"]


def test_a_step_can_be_split_and_a_request_ended_while_it_runs():
    """An embedding engine schedules, runs the step elsewhere, and may end a request in between
    (a client went away): the step then applies without it, and its blocks are free."""
    from kvsched import SequenceStatus, StepResult

    engine = unit_engine(
        decode_lane=False
    )  # the lane is the simulator's; an embedding engine's executor knows no tokens ahead
    for rid in "ab":
        engine.add_request(req(rid, 4, 5))
    engine.step()
    output = engine.schedule()
    assert sorted(sg.group.request_id for sg in output.scheduled) == ["a", "b"]
    assert engine.abort("a", SequenceStatus.FINISHED_STOPPED)
    seq_b = engine._groups["b"].seqs[0].seq_id
    report = engine.complete(output, StepResult(1.0, {seq_b: [7]}))
    assert [sg.group.request_id for sg in report.output.scheduled] == ["b"]
    assert (
        engine._groups["a"].status is SequenceStatus.FINISHED_STOPPED and engine._groups["b"].num_generated_tokens == 2
    )
    engine.run()
    assert engine.leaked_blocks == 0
    with pytest.raises(ValueError, match="not a finished state"):
        engine.abort("b", SequenceStatus.RUNNING)
    with pytest.raises(ValueError, match="not a valid SequenceStatus"):  # not an AttributeError on a foreign value
        engine.abort("b", "stopped")


def test_a_group_tells_the_blocks_it_holds_counting_shared_ones_once():
    engine = unit_engine(num_gpu_blocks=8, num_cpu_blocks=8, preemption_mode="swap")
    engine.add_request(req("forked", 8, 6, n=3))  # three sequences over one 8-token prompt: two shared blocks
    held = []
    for _ in range(4):
        engine.step()
        (view,) = engine.running
        gpu, cpu = engine.cache.blocks_held(view)
        assert (gpu, cpu) == (8 - engine.cache.num_free_gpu_blocks, 0)  # the only group: all that is not free
        held.append(gpu)
    assert held == [2, 2 + 3, 5, 5]  # the prompt's blocks once, then a block of its own per sequence
    engine.add_request(req("late", 4, 8))
    while not engine.swapped:
        engine.step()
    (view,) = engine.swapped
    assert engine.cache.blocks_held(view) == (0, 8 - engine.cache.num_free_cpu_blocks)
    with pytest.raises(ValueError, match="not a request of its engine"):
        unit_engine().cache.blocks_held(view)


def test_a_view_tells_session_slo_class_computed_tokens_and_when_it_last_queued():
    """What new policies need (issue 23) comes from the view: session and SLO class from the request,
    the KV tokens a recompute would lose, and when the group last joined the waiting queue."""
    from pydantic import ValidationError

    engine = unit_engine(num_gpu_blocks=4, preemption_mode="recompute")
    engine.add_request(req("a", 4, 8, session_id="chat-1", slo_class="interactive"))
    engine.add_request(req("b", 4, 8, arrival=0.0))
    a, b = engine.groups["a"], engine.groups["b"]
    assert (a.session_id, a.slo_class, b.session_id, b.slo_class) == ("chat-1", "interactive", None, None)
    assert a.num_computed_tokens == 0 and a.last_queued_time == 0.0
    computed, queued = [], []
    while engine.has_unfinished():
        report = engine.step()
        computed.append(a.num_computed_tokens)
        if not a.status.is_finished:
            assert a.num_computed_tokens == a.num_tokens - a.num_uncomputed_tokens
        for g, _ in report.output.preempted:
            queued.append((g.request_id, g.last_queued_time, report.started))
    assert computed[0] == 4 and max(computed) > 4
    assert queued and all(t == started for _, t, started in queued)  # a recompute victim queued again as its step began
    for bad in ("", "  ", "x" * 257):
        with pytest.raises(ValidationError):
            req("c", 4, 1, slo_class=bad)
        with pytest.raises(ValidationError):
            req("c", 4, 1, session_id=bad)


def test_a_batch_entry_tells_which_sequences_sample_and_how_many_tokens():
    """What an executor samples (issue 21): ``n`` tokens at the prompt of a group not yet forked, then one per sequence;
    nothing for a prefill chunk that leaves prompt tokens uncomputed."""
    engine = unit_engine("sarathi", decode_lane=False, max_num_batched_tokens=8, max_num_seqs=8, max_model_len=64)
    engine.add_request(req("forked", 4, 3, n=2))
    engine.add_request(req("chunked", 12, 2))
    seen = []
    while engine.has_unfinished():
        output = engine.schedule()
        samples = {sg.group.request_id: [(s.seq_id, n) for s, n in sg.samples()] for sg in output.scheduled}
        seen.append(samples)
        tokens = {seq_id: [7] * n for entry in samples.values() for seq_id, n in entry}
        engine.complete(output, kvsched.StepResult(1.0, tokens))
    first = engine._groups["forked"].seqs[0].seq_id
    assert seen[0]["forked"] == [(first, 2)] and all(len(s.get("forked", [])) in (0, 2) for s in seen[1:])
    assert any(s.get("chunked") == [] for s in seen) and sum(bool(s.get("chunked")) for s in seen) == 2


def test_an_order_only_policy_subclasses_the_public_base():
    """The waiting order a policy considers is public (issue 21): ``kvsched.ContinuousBatching.order_waiting``."""
    from kvsched import ContinuousBatching

    class LongestFirst(ContinuousBatching):
        name = "longest-first"

        def order_waiting(self, step):
            return sorted(step.waiting, key=lambda g: -g.prompt_len)

    engine = Engine(EngineConfig(max_num_seqs=1), LongestFirst, SimulatedExecutor())
    for rid, prompt in (("a", 8), ("b", 30), ("c", 16)):
        engine.add_request(req(rid, prompt, 2))
    assert [g.request_id for g in engine.run()] == ["b", "c", "a"]


def test_the_engine_gives_its_requests_by_id_as_read_only_views():
    """``Engine.groups`` once handed out the engine's own groups, and its own dict (issue 21)."""
    engine = unit_engine()
    engine.add_request(req("a", 4, 2))
    groups = engine.groups
    assert isinstance(groups["a"], GroupView) and list(groups) == ["a"] and "b" not in groups
    engine.add_request(req("b", 4, 2))
    assert [v.request_id for v in groups.values()] == ["a", "b"]  # live
    with pytest.raises(TypeError):
        groups["c"] = groups["a"]
    with pytest.raises(TypeError):
        del groups["a"]
    assert not hasattr(groups, "__dict__") and not hasattr(groups, "_groups")
    engine.run()
    assert all(v.status.is_finished for v in engine.groups.values()) and len(engine.groups) == 2
