"""Policies decide, the core enforces: every invalid decision is a PolicyError and leaves no trace."""

from __future__ import annotations

import pytest
from helpers import req, unit_engine

from kvsched import Engine, EngineConfig, Outcome, PolicyError, Preemption, SimulatedExecutor, hookimpl
from kvsched.allocators import AllocStatus
from kvsched.core.sequence import SequenceStatus
from kvsched.core.view import GroupView
from kvsched.policies.vllm_default import VllmDefault


def state(e: Engine):
    s, bm = e.scheduler, e.scheduler.block_manager
    return (
        [g.request_id for g in s.waiting],
        [g.request_id for g in s.running],
        [g.request_id for g in s.swapped],
        {k: list(v) for k, v in bm.gpu_tables.items()},
        list(bm.gpu.ref_counts),
        s.num_running_seqs,
        [(g.status, [x.status for x in g.seqs]) for g in e._groups.values()],
    )


def started(policy, n=3, **config):
    """An engine with ``n`` requests already running (vllm-default did the first step)."""
    e = unit_engine(policy, **config)
    for i in range(n):
        e.add_request(req(f"r{i}", prompt_len=6, output_len=8))
    return e


class AdmitRunning(VllmDefault):
    """Admits a group that is already running."""

    name = "admit-running"

    @hookimpl
    def select_batch(self, step):
        if step.running:
            step.admit(step.running[0])
        else:
            super().select_batch(step)


class Twice(VllmDefault):
    name = "twice"

    @hookimpl
    def select_batch(self, step):
        if step.running:
            step.advance(step.running[0])
            step.advance(step.running[0])
        else:
            super().select_batch(step)


class RaisesMidStep:
    """Admits everything, then fails: the admissions must be undone."""

    name = "raises-mid-step"

    def __init__(self):
        self.calls = 0

    @hookimpl
    def select_batch(self, step):
        self.calls += 1
        for g in step.running:
            step.advance(g)
        for g in step.waiting:
            step.admit(g)
        if self.calls == 1:
            raise ZeroDivisionError("boom")


@pytest.mark.parametrize(
    "policy, message",
    [
        (AdmitRunning, "admit: 'r0' is RUNNING, not WAITING"),
        (Twice, "advance: 'r0' was already scheduled in this step"),
    ],
)
def test_invalid_operation_is_a_policy_error_and_changes_nothing(policy, message):
    e = started(policy)
    e.step()  # the first step falls through to vllm-default: everything admitted
    before = state(e)
    with pytest.raises(PolicyError, match=f"policy '{policy.name}' in select_batch: {message}"):
        e.step()
    assert state(e) == before and e.scheduler.audit() == []


def test_a_policy_that_raises_is_rolled_back_and_the_engine_carries_on():
    e = started(RaisesMidStep)
    before = state(e)
    with pytest.raises(PolicyError, match="raised ZeroDivisionError: boom"):
        e.step()
    assert state(e) == before and e.scheduler.block_manager.num_free_gpu_blocks == 64
    e.run()
    assert all(g.status is SequenceStatus.FINISHED_STOPPED for g in e._groups.values()) and e.leaked_blocks == 0


class LiesAboutCapacity(VllmDefault):
    name = "liar"

    @hookimpl
    def can_allocate(self, step, group):
        return AllocStatus.OK


def test_ok_without_free_blocks_is_rejected():
    e = unit_engine(LiesAboutCapacity, num_gpu_blocks=4)
    e.add_request(req("a", prompt_len=12, output_len=4))
    e.add_request(req("b", prompt_len=12, output_len=4))
    before = state(e)
    with pytest.raises(PolicyError, match=r"in can_allocate: said OK for 'b', which needs 3 blocks with 1 free"):
        e.step()
    assert state(e) == before


class BadVictim(VllmDefault):
    name = "bad-victim"

    @hookimpl
    def choose_preemption(self, step, requester):
        return Preemption(step.running[0])  # the oldest, which vllm-default has already advanced


class JunkAnswers(VllmDefault):
    name = "junk"

    @hookimpl
    def choose_preemption(self, step, requester):
        return "the tail please"


@pytest.mark.parametrize(
    "policy, message",
    [
        (BadVictim, "in choose_preemption: picked 'r0', which is scheduled, not an unscheduled running group"),
        (JunkAnswers, "in choose_preemption: returned 'the tail please', expected a Preemption"),
    ],
)
def test_invalid_victims_are_rejected(policy, message):
    e = started(policy, n=3, num_gpu_blocks=6)
    with pytest.raises(PolicyError, match=message):
        for _ in range(50):
            e.step()
    assert e.scheduler.audit() == []


def test_can_allocate_must_answer_an_alloc_status():
    class Junk(VllmDefault):
        name = "junk-alloc"

        @hookimpl
        def can_allocate(self, step, group):
            return True

    e = started(Junk)
    with pytest.raises(PolicyError, match="in can_allocate: returned True, expected an AllocStatus"):
        e.step()


def test_hook_with_an_unknown_argument_is_refused_at_load():
    class Bad:
        name = "bad-signature"

        @hookimpl
        def select_batch(self, step, budget):
            pass

    with pytest.raises(PolicyError, match="bad-signature.*invalid plugin"):
        Engine(EngineConfig(), Bad, SimulatedExecutor())


def test_misspelt_hook_is_refused_at_load():
    class Typo:
        name = "typo"

        @hookimpl
        def select_btach(self, step):
            pass

    with pytest.raises(PolicyError, match="select_btach"):
        Engine(EngineConfig(), Typo, SimulatedExecutor())


def test_a_policy_with_only_a_victim_rule_inherits_vllm_default_batching():
    class OldestFirst:
        """Evict the oldest unscheduled running group instead of the newest."""

        name = "oldest-first"

        @hookimpl
        def choose_preemption(self, step, requester):
            for g in step.running:
                if g is not requester and not step.was_touched(g):
                    return Preemption(g)
            return None

    e = started(OldestFirst, n=3, num_gpu_blocks=6)
    e.run()
    assert e.leaked_blocks == 0 and all(g.is_finished for g in e._groups.values())


def test_views_are_read_only():
    e = started("vllm-default")
    view = e._groups["r0"].view
    assert isinstance(view, GroupView)
    with pytest.raises(AttributeError):
        view.priority = -5
    with pytest.raises(AttributeError):
        view.status = SequenceStatus.RUNNING


def test_abort_frees_blocks_in_every_queue():
    e = unit_engine(num_gpu_blocks=12)
    e.add_request(req("solo", prompt_len=7, output_len=30))
    e.add_request(req("pair", prompt_len=7, output_len=30, n=2))
    e.add_request(req("late", prompt_len=7, output_len=3, arrival=100.0))
    for _ in range(100):
        e.step()
        if e.scheduler.swapped:
            break
    e.add_request(req("waiting", prompt_len=4, output_len=3))
    assert e.scheduler.swapped and e.scheduler.running and e.scheduler.waiting
    for rid in ("pair", "solo", "waiting"):
        assert e.abort(rid)
        assert e._groups[rid].status is SequenceStatus.FINISHED_ABORTED
    assert not e.abort("pair")  # already ended
    assert e.scheduler.block_manager.num_held_blocks == 0 and e.scheduler.audit() == []


def test_chunked_prefill_through_the_step_operations():
    class Chunker:
        """Admit or advance everything in chunks of at most 5 tokens."""

        name = "chunker"

        @hookimpl
        def select_batch(self, step):
            for g in step.running:
                step.advance(g, max_tokens=5)
            for g in step.waiting:
                if step.admit(g, max_tokens=5) is not Outcome.SCHEDULED:
                    break

    e = unit_engine(Chunker)
    e.add_request(req("a", prompt_len=12, output_len=3))
    chunks = [e.step().output.scheduled[0].num_tokens for _ in range(3)]
    assert chunks == [5, 5, 2]
    g = e._groups["a"]
    assert g.first_token_time == 3.0 and len(g.seqs[0].output) == 1
    e.run()
    assert g.status is SequenceStatus.FINISHED_STOPPED and e.leaked_blocks == 0


def test_a_group_swapped_mid_prefill_resumes_in_chunks():
    """Its remaining prompt is larger than the budget: swap_in must accept a chunk size."""

    class ChunkerThatEvicts:
        name = "chunker-that-evicts"

        def __init__(self):
            self.steps = 0

        @hookimpl
        def select_batch(self, step):
            self.steps += 1
            if self.steps == 2:  # evict the half-prefilled group, swapping it out
                step.preempt(step.running[0], PreemptionMode.SWAP)
                return
            for g in step.swapped:
                step.swap_in(g, max_tokens=8)
            for g in step.running:
                step.advance(g, max_tokens=8)
            for g in step.waiting:
                step.admit(g, max_tokens=8)

    from kvsched import PreemptionMode

    e = unit_engine(ChunkerThatEvicts, max_num_batched_tokens=8, max_num_seqs=4, max_model_len=64)
    e.add_request(req("long", prompt_len=30, output_len=2))
    e.step()
    assert e.step().output.preempted and e.scheduler.swapped
    chunk = e.step()
    assert chunk.output.blocks_to_swap_in and [s.num_tokens for s in chunk.output.scheduled] == [8]
    e.run()
    assert e._groups["long"].status is SequenceStatus.FINISHED_STOPPED and e.leaked_blocks == 0


def test_queue_views_are_lazy_read_only_sequences():
    seen = {}

    class Peek(VllmDefault):
        name = "peek"

        @hookimpl
        def select_batch(self, step):
            w = step.waiting
            seen.update(
                len=len(w),
                first=w[0].request_id,
                last=w[-1].request_id,
                ids=[g.request_id for g in w],
                sliced=[g.request_id for g in w[1:]],
                reversed=[g.request_id for g in reversed(w)],
            )
            with pytest.raises(TypeError):
                w[0] = w[1]
            return super().select_batch(step)

    e = started(Peek, n=3)
    e.step()
    assert seen == {
        "len": 3,
        "first": "r0",
        "last": "r2",
        "ids": ["r0", "r1", "r2"],
        "sliced": ["r1", "r2"],
        "reversed": ["r2", "r1", "r0"],
    }


class Loosens(VllmDefault):
    """Loosens its budgets through the config's ``__dict__``, past its frozen ``__setattr__``, then admits what they
    let in."""

    name = "loosens"

    @hookimpl
    def select_batch(self, step):
        vars(step.config).update(max_num_batched_tokens=10**6, max_num_seqs=10**6)
        super().select_batch(step)


def test_engine_check_fails_a_policy_that_loosens_the_config():
    """Issue 21: the core once enforced the budgets of the config it handed the policy, and the check compared with
    the same changed object, so that such a policy passed budgets-respected with steps 16 times over budget."""
    from kvsched.testing.checks import FAIL, check_machine
    from kvsched.testing.invariants import BUDGETS_RESPECTED, VALID_DECISIONS

    results = {
        r.invariant: r
        for r in check_machine(
            Loosens, max_examples=8, steps=12, only={VALID_DECISIONS, BUDGETS_RESPECTED}, shrink=False
        )
    }
    assert results[VALID_DECISIONS].status == FAIL and "__dict__" in results[VALID_DECISIONS].detail, results[
        VALID_DECISIONS
    ]


class Reorders:
    """Reorders the waiting queue as ``how`` says (``reorder_waiting``), then admits nothing, or fails."""

    name = "reorders"

    def __init__(self, how: str = "reverse"):
        self.how = how

    @hookimpl
    def select_batch(self, step):
        front = list(step.waiting[:3])
        if self.how == "after-admit":
            step.admit(front[0])
            step.reorder_waiting(front[1:][::-1])
        elif self.how == "missing":
            step.reorder_waiting([front[2], front[0]])
        elif self.how == "twice":
            step.reorder_waiting([front[1], front[1], front[0]])
        elif self.how == "not-a-view":
            step.reorder_waiting([g.request_id for g in front])
        else:
            step.reorder_waiting(front[::-1])
            if self.how == "then-raise":
                raise ZeroDivisionError("boom")


@pytest.mark.parametrize(
    "how, message",
    [
        ("after-admit", "reorder_waiting: expected the first waiting groups, each once, before any admission"),
        ("missing", "reorder_waiting: expected the first waiting groups"),
        ("twice", "reorder_waiting: expected the first waiting groups"),
        ("not-a-view", "reorder_waiting: expected a GroupView"),
        ("then-raise", "raised ZeroDivisionError: boom"),
    ],
)
def test_a_reorder_of_the_waiting_queue_is_checked_and_undone_with_a_failed_step(how, message):
    """``reorder_waiting`` takes only a permutation of the queue's front, before any admission; a step that fails
    after a valid reorder leaves the queue as it found it."""
    e = unit_engine(Reorders(how))
    for i in range(4):
        e.add_request(req(f"r{i}", prompt_len=6, output_len=8))
    before = state(e)
    with pytest.raises(PolicyError, match=message):
        e.step()
    assert state(e) == before and e.scheduler.audit() == []


def test_a_reorder_of_the_waiting_queue_persists():
    e = unit_engine(Reorders())
    for i in range(4):
        e.add_request(req(f"r{i}", prompt_len=6, output_len=8))
    e.step()
    assert [g.request_id for g in e.scheduler.waiting] == ["r2", "r1", "r0", "r3"]
