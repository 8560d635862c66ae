"""The decode lane changes how fast the simulator runs, never what it computes.

The main property: for random workloads, configs, policies and aborts, an engine with the lane
and one without produce the same steps (batch, tokens per group, preemptions, swaps, copies,
features, durations, finishes) and the same requests (tokens, status, times), with every step
audited, the lane's own bookkeeping included.
"""

from __future__ import annotations

import pytest
from helpers import CountingPolicy, engine_configs, req
from hypothesis import event, given, note
from hypothesis import strategies as st

from kvsched import Engine, EngineConfig
from kvsched.core.config import PreemptionMode
from kvsched.core.decisions import Outcome
from kvsched.core.hookspecs import hookimpl
from kvsched.core.request import Request, SamplingParams
from kvsched.errors import PolicyError
from kvsched.executors.simulated import EOS, SimulatedExecutor
from kvsched.policies.continuous import decode_then_resume
from kvsched.policies.vllm_default import VllmDefault


class ChunkedAfterDecoding:
    """Decodes through advance_running, then admits prompts in chunks that leave one token over,
    so that a prompt's last token (and first sample, or a recompute's) meets the lane's rules."""

    name = "chunked-after-decoding"

    @hookimpl
    def select_batch(self, step):
        if not decode_then_resume(step):
            return
        for group in step.waiting:
            left = group.num_uncomputed_tokens  # prompt, or prompt and output after a recompute
            chunk = left - 1 if group.max_running_seqs == 1 and left > 1 else None
            if step.admit(group, max_tokens=chunk) is not Outcome.SCHEDULED:
                break


class DecodesTwice(VllmDefault):
    """vllm-default plus a second advance_running call, which must be a no-op."""

    name = "decodes-twice"

    @hookimpl
    def select_batch(self, step):
        super().select_batch(step)
        step.advance_running()


class CappedDecodesThenTheRest:
    """advance_decodes under a small cap, then advance_running for what is left, then chunked
    admissions: the lane, a cap that stops it, and the per-sequence loop in one step."""

    name = "capped-decodes"

    @hookimpl
    def select_batch(self, step):
        step.advance_decodes(max_tokens=3)
        step.advance_running(stop_on_preempted=False)
        if step.num_preempted or step.swapped:
            for group in step.swapped:
                step.swap_in(group)
            return
        for group in step.waiting:
            chunk = 5 if group.max_running_seqs == 1 else None
            if step.admit(group, max_tokens=chunk) is not Outcome.SCHEDULED:
                break


POLICIES = [
    "vllm-default",
    "fcfs",
    "sjf",
    "sarathi",
    "vtc",
    "lpm",
    ChunkedAfterDecoding,
    DecodesTwice,
    CappedDecodesThenTheRest,
]

configs = engine_configs(max_model_len=st.sampled_from([None, 48, 80]), delay_factor=st.sampled_from([0.0, 0.5]))
requests = st.lists(
    st.tuples(
        st.integers(1, 60),
        st.integers(1, 30),
        st.sampled_from([1, 1, 1, 2]),
        st.floats(0, 3, allow_nan=False),
        st.integers(0, 8),
        st.booleans(),
        st.sampled_from([(), (-5,), (-1, -9)]),
    ),
    min_size=1,
    max_size=14,
)


def _request(i, prompt, output, n, arrival, extra, ignore_eos, stops) -> Request:
    return Request(
        request_id=f"r{i}",
        prompt_len=prompt,
        output_len=output,
        arrival_time=round(arrival, 3),
        tenant=f"t{i % 2}",
        sampling=SamplingParams(n=n, max_tokens=output + extra, ignore_eos=ignore_eos, stop_token_ids=stops),
    )


def _trace(policy, config, reqs, aborts, abort_step, lane):
    """Everything observable of a run, step by step, then request by request."""
    engine = Engine(EngineConfig(**config, decode_lane=lane, audit_every_step=True), policy, SimulatedExecutor())
    bm = engine.scheduler.block_manager
    steps, lane_steps = [], [0]

    def record(report):
        out = report.output
        lane_steps[0] += out.lane_decodes > 0
        steps.append(
            (
                report.step,
                report.now,
                report.duration,
                [(s.group.request_id, s.num_tokens, s.is_prefill) for s in out.scheduled],
                [(g.request_id, mode.value) for g, mode in out.preempted],
                out.blocks_to_swap_in,
                out.blocks_to_swap_out,
                out.blocks_to_copy,
                report.features,
                [g.request_id for g in report.finished],
                report.num_waiting,
                report.num_running,
                {sid: tuple(t) for sid, t in bm.gpu_tables.items()},
                {sid: tuple(t) for sid, t in bm.cpu_tables.items()},
            )
        )
        if report.step == abort_step:
            for i in aborts:
                engine.abort(f"r{i}")

    engine.run(reqs, on_step=record)
    finals = {
        g.request_id: (
            g.status,
            g.finish_time,
            g.first_token_time,
            g.num_generated_tokens,
            [list(s.output) for s in g.seqs],
            g.num_recompute_preemptions,
            g.num_swap_preemptions,
        )
        for g in engine._groups.values()
    }
    assert engine.leaked_blocks == 0
    return steps, finals, lane_steps[0]


@given(
    policy=st.sampled_from(POLICIES),
    config=configs,
    spec=requests,
    aborts=st.lists(st.integers(0, 13), max_size=3),
    abort_step=st.integers(0, 40),
)
def test_the_lane_changes_nothing_observable(policy, config, spec, aborts, abort_step):
    reqs = [_request(i, *row) for i, row in enumerate(spec)]
    with_lane = _trace(policy, config, reqs, aborts, abort_step, lane=True)
    without = _trace(policy, config, reqs, aborts, abort_step, lane=False)
    note(f"{with_lane[2]} lane steps of {len(with_lane[0])}")
    event("lane used" if with_lane[2] else "lane not used")
    assert without[2] == 0
    assert with_lane[0] == without[0]
    assert with_lane[1] == without[1]


def test_a_plain_decode_workload_runs_mostly_in_the_lane_and_matches():
    reqs = [req(f"r{i}", 20 + 7 * i, 40 + 13 * i, arrival=0.05 * i) for i in range(12)]
    config = dict(block_size=4, num_gpu_blocks=400, max_num_batched_tokens=512)
    steps, finals, lane_steps = _trace("vllm-default", config, reqs, [], -1, lane=True)
    assert lane_steps > len(steps) // 2
    assert (steps, finals) == _trace("vllm-default", config, reqs, [], -1, lane=False)[:2]


def test_reading_a_member_mid_run_sees_every_token_it_decoded():
    """An observer that reads running sequences sees what the sequence-by-sequence engine has."""
    reqs = [req(f"r{i}", 9, 30, arrival=0.01 * i) for i in range(5)]
    seen = {True: [], False: []}
    for lane in (True, False):
        engine = Engine(
            EngineConfig(block_size=4, num_gpu_blocks=200, decode_lane=lane), "vllm-default", SimulatedExecutor()
        )

        def look(report, lane=lane, engine=engine):
            seen[lane].append(
                [
                    (g.request_id, s.num_tokens, s.num_computed_tokens, list(s.output), g.num_generated_tokens)
                    for g in engine.scheduler.running
                    for s in g.seqs
                ]
            )

        engine.run(reqs, on_step=look)
    assert seen[True] == seen[False]
    assert any(row for row in seen[True])


def test_a_prompt_finished_by_its_last_chunk_gets_its_first_token_time():
    """A one-token prompt remainder samples the first token: it runs outside the lane, which records no first-token
    time."""
    reqs = [req("a", 8, 12), req("b", 8, 12, arrival=0.01)]
    for lane in (True, False):
        engine = Engine(
            EngineConfig(block_size=4, num_gpu_blocks=100, decode_lane=lane), ChunkedAfterDecoding, SimulatedExecutor()
        )
        engine.run(reqs)
        assert all(
            g.first_token_time is not None and g.first_token_time < g.finish_time for g in engine._groups.values()
        )


def test_a_second_advance_running_in_a_lane_step_is_a_no_op():
    engine = Engine(EngineConfig(block_size=4, num_gpu_blocks=200), DecodesTwice, SimulatedExecutor())
    engine.run([req(f"r{i}", 10, 30) for i in range(4)])
    assert all(g.status.name == "FINISHED_STOPPED" for g in engine._groups.values())
    assert engine.leaked_blocks == 0


class RecomputesYThenChunksIt:
    """Preempts Y by recompute at its third step, then re-admits it leaving one token for the lane."""

    name = "recomputes-y"

    def __init__(self) -> None:
        self.calls = 0

    @hookimpl
    def select_batch(self, step):
        self.calls += 1
        if self.calls == 3:
            step.preempt(next(g for g in step.running if g.request_id == "Y"), PreemptionMode.RECOMPUTE)
        if not decode_then_resume(step):
            return
        for group in step.waiting:
            left = group.num_uncomputed_tokens
            step.admit(group, max_tokens=left - 1 if group.first_token_time is not None else None)


def test_blocks_falling_due_together_are_taken_in_running_order():
    """Y rejoins after a recompute with one token left and a block due a full block later, the
    same lane step as X's: the lane must take X's block first, as the per-sequence loop does."""
    reqs = [req("X", 1, 30), req("Y", 3, 30)]
    config = dict(block_size=4, num_gpu_blocks=100)
    with_lane = _trace(RecomputesYThenChunksIt, config, reqs, [], -1, lane=True)
    assert with_lane[2] > 0
    assert with_lane[:2] == _trace(RecomputesYThenChunksIt, config, reqs, [], -1, lane=False)[:2]


class DecodesFirstInSmallChunks:
    """advance_decodes, then every prefill continues 4 tokens at a time, prompts admitted likewise."""

    name = "decodes-first-small-chunks"

    @hookimpl
    def select_batch(self, step):
        step.advance_decodes()
        for group in step.running:
            if not step.was_touched(group):
                step.advance(group, max_tokens=4)
        for group in step.waiting:
            step.admit(group, max_tokens=4)


def test_members_behind_a_prefill_take_blocks_in_running_order():
    """B decodes (and joins) while A, ahead of it in the running queue, is still in its prefill;
    A joins later. Blocks falling due together must still go to A first."""
    reqs = [req("A", 12, 20), req("B", 3, 20)]
    config = dict(block_size=1, num_gpu_blocks=200)
    with_lane = _trace(DecodesFirstInSmallChunks, config, reqs, [], -1, lane=True)
    assert with_lane[2] > 0
    assert with_lane[:2] == _trace(DecodesFirstInSmallChunks, config, reqs, [], -1, lane=False)[:2]


def test_members_finishing_together_finish_in_running_order():
    """sarathi with a small token budget: r6 is still in its chunked prefill when r8, behind it,
    joins the lane; both end in the same step, and are reported in running order (r6 first)."""

    def r(rid, prompt, out, arrival, max_tokens, **sampling):
        return Request(
            request_id=rid,
            prompt_len=prompt,
            output_len=out,
            arrival_time=arrival,
            sampling=SamplingParams(max_tokens=max_tokens, **sampling),
        )

    reqs = [
        r("r1", 1, 27, 0.158, 37),
        r("r2", 38, 19, 0.18, 23),
        r("r4", 28, 28, 0.059, 29),
        r("r6", 37, 4, 0.211, 7, stop_token_ids=(-1, -16)),
        r("r8", 10, None, 0.178, 40, ignore_eos=True),
    ]
    config = EngineConfig(
        block_size=2,
        num_gpu_blocks=48,
        num_cpu_blocks=200,
        watermark=0.0,
        max_num_batched_tokens=16,
        max_num_seqs=16,
        max_model_len=64,
        preemption_mode="swap",
        audit_every_step=True,
    )
    finished = {}
    for lane in (True, False):
        engine = Engine(
            config.model_copy(update={"decode_lane": lane}),
            "sarathi",
            SimulatedExecutor(),
            policy_options={"token_budget": 8},
        )
        steps = []
        engine.run(reqs, on_step=lambda report, steps=steps: steps.append([g.request_id for g in report.finished]))
        finished[lane] = steps, [g.request_id for g in engine.finished]
    assert finished[True] == finished[False]


class _UnknownTokens(SimulatedExecutor):
    """An executor that, like a real model, cannot say its tokens in advance (no KnownTokens): no fast path."""

    fast_path = None


def test_prefix_caching_and_executors_without_known_tokens_do_not_use_the_lane():
    assert (
        Engine(EngineConfig(enable_prefix_caching=True), "vllm-default", SimulatedExecutor()).scheduler.fast_path
        is None
    )
    assert Engine(EngineConfig(decode_lane=False), "vllm-default", SimulatedExecutor()).scheduler.fast_path is None
    assert Engine(EngineConfig(), "vllm-default", _UnknownTokens()).scheduler.fast_path is None
    assert Engine(EngineConfig(), "vllm-default", SimulatedExecutor()).scheduler.fast_path is not None


class _RaisesAfterDecoding(CountingPolicy):
    name = "raises-after-decoding"

    @hookimpl
    def select_batch(self, step):
        super().select_batch(step)
        if self.calls == 12:
            raise RuntimeError("boom")


def test_a_policy_failing_after_a_lane_step_leaves_the_engine_as_before_the_step():
    # Every call counts: a steady step would be repeated without calling the policy.
    engine = Engine(
        EngineConfig(block_size=4, num_gpu_blocks=200), _RaisesAfterDecoding, SimulatedExecutor(steady_steps=False)
    )
    for i in range(4):
        engine.add_request(req(f"r{i}", 10, 50))
    engine.step()  # the prompts
    for _ in range(10):
        assert engine.step().output.lane_decodes == 4
    before = [
        (s.num_tokens, list(s.output), engine.scheduler.block_manager.block_table(s.seq_id))
        for g in engine.scheduler.running
        for s in g.seqs
    ]
    free = engine.scheduler.block_manager.num_free_gpu_blocks
    with pytest.raises(PolicyError, match="boom"):
        engine.step()
    after = [
        (s.num_tokens, list(s.output), engine.scheduler.block_manager.block_table(s.seq_id))
        for g in engine.scheduler.running
        for s in g.seqs
    ]
    assert after == before and engine.scheduler.block_manager.num_free_gpu_blocks == free
    engine.check()


def test_known_tokens_are_the_tokens_the_executor_samples():
    ex = SimulatedExecutor(block_size=4)
    group = Engine(EngineConfig(), "vllm-default", SimulatedExecutor()).add_request(
        Request(request_id="a", prompt_len=3, output_len=6, sampling=SamplingParams(max_tokens=9, stop_token_ids=(-6,)))
    )
    assert ex.tokens_at(group, 1, 9) == [-3, -4, -5, -6, -7, EOS, EOS, EOS]
    assert ex.first_stop(group, 1) == 4  # the placeholder -6 is position 4
    assert ex.first_stop(group, 5) == 6  # then EOS at the output length
    ignoring = Engine(EngineConfig(), "vllm-default", SimulatedExecutor()).add_request(
        Request(request_id="b", prompt_len=3, output_len=2, sampling=SamplingParams(max_tokens=9, ignore_eos=True))
    )
    assert ex.first_stop(ignoring, 1) is None and ex.tokens_at(ignoring, 2, 4) == [EOS, EOS]
