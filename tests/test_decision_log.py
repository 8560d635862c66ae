"""The decision log, reason by reason, on hand-built workloads whose every wait has a known cause.

Every non-empty step takes exactly one simulated second and blocks hold four tokens, so each
row below was worked out by hand from the rules of ``vllm-default`` (and is commented where it
is not obvious). Then the properties: the log is the same with and without the decode lane, the
time it attributes adds up to each request's time in the queues, and the inter-token latencies
replayed from it add up to every request's decode time, token by token.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from helpers import req
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kvsched.core.config import EngineConfig
from kvsched.core.decisions import Outcome
from kvsched.core.hookspecs import hookimpl
from kvsched.executors.cost_model import CostProfile
from kvsched.experiments.simulation import SimJob
from kvsched.metrics.inter_token import inter_token_latencies
from kvsched.metrics.phases import all_phases
from kvsched.metrics.wait_reasons import WaitReasons
from kvsched.reporting.files import read_run, write_outputs

UNIT = CostProfile(
    name="unit-second",
    base_ms=1000,
    prefill_token_ms=0,
    decode_seq_ms=0,
    kv_token_ms=0,
    kv_bytes_per_token=0,
    swap_gb_per_s=1e9,
    copy_gb_per_s=1e9,
)
UNIT_CONFIG = dict(
    block_size=4,
    num_gpu_blocks=64,
    num_cpu_blocks=64,
    watermark=0.0,
    max_num_batched_tokens=256,
    max_num_seqs=64,
    audit_every_step=True,
)
KEY = ["step", "event", "request_id", "reason", "queue", "needed", "available", "other_request"]


class Given:
    """A workload of the requests given (what SimJob asks of a workload)."""

    def __init__(self, requests):
        self._requests = requests

    def requests(self):
        return list(self._requests)

    def describe(self):
        return {"kind": "hand-built", "num_requests": len(self._requests)}


def run(tmp_path, requests, policy="vllm-default", profile=UNIT, **config):
    job = SimJob(
        Given(requests),
        policy,
        EngineConfig(**{**UNIT_CONFIG, **config}),
        profile,
        decision_log=tmp_path / "decisions.parquet",
    )
    write_outputs(job.run(), tmp_path)
    return read_run(tmp_path)


def rows(events: pd.DataFrame, *events_of: str) -> list[tuple]:
    """The log's rows (``events_of`` only, if given) as tuples of the ``KEY`` fields, nulls as None."""
    if events_of:
        events = events[events.event.isin(events_of)]
    out = events[KEY].astype(object).where(events[KEY].notna(), None)
    return [tuple(int(v) if isinstance(v, float) else v for v in row) for row in out.itertuples(index=False)]


def runs(why: WaitReasons, rid: str, queue: str, first: int, last: int, start: float):
    return [
        (r.key, r.first_step, r.last_step, dict(r.seconds), {k: list(v) for k, v in r.numbers.items() if v}, r.blockers)
        for r in why.reason_runs(rid, queue, first, last, start)
    ]


def test_token_and_sequence_budgets_head_of_line_and_prefill_only_steps(tmp_path):
    log = run(tmp_path, [req("a", 10, 3), req("b", 10, 1), req("c", 4, 2)], max_num_batched_tokens=16, max_num_seqs=2)
    assert rows(log.events, "admitted", "wait", "left_out") == [
        (0, "admitted", "a", None, "waiting", None, None, None),
        (0, "wait", "b", "token_budget", "waiting", 10, 6, None),  # 10 tokens, 16 - 10 left: vllm-default stops here
        (1, "admitted", "b", None, "waiting", None, None, None),
        (1, "wait", "c", "seq_budget", "waiting", 1, 0, None),  # a and b run: max_num_seqs=2 is full
        (1, "left_out", None, "not_offered", "running", None, None, None),  # a prefill-only step: a waits
        (2, "admitted", "c", None, "waiting", None, None, None),
        (2, "left_out", None, "not_offered", "running", None, None, None),
    ]
    why = WaitReasons(log.events, log.steps, log.requests)
    assert runs(why, "c", "waiting", 0, 1, 0.0) == [  # c was never offered in step 0: it waited behind b
        ("behind", 0, 0, {"behind:token_budget": 1.0}, {"behind:token_budget": [(10, 6)]}, ["b"]),
        ("seq_budget", 1, 1, {"seq_budget": 1.0}, {"seq_budget": [(1, 0)]}, []),
    ]
    table = why.time_by_reason().set_index(["queue", "key"]).request_s.to_dict()
    assert table == {
        ("waiting", "token_budget"): 1.0,
        ("waiting", "behind:token_budget"): 1.0,
        ("waiting", "seq_budget"): 1.0,
        ("running", "prefill_only"): 2.0,
    }  # a, left out of steps 1 and 2


def test_no_blocks_with_the_numbers_compared_against_the_watermark(tmp_path):
    log = run(tmp_path, [req("a", 16, 3), req("b", 12, 1), req("c", 4, 1)], num_gpu_blocks=8, watermark=0.25)
    # 8 blocks, 2 kept free: a takes 4; b needs 3 and 4 - 3 < 2 (LATER) until a grows to 5 blocks, then ends
    assert rows(log.events, "wait") == [
        (0, "wait", "b", "no_blocks", "waiting", 3, 4, None),
        (1, "wait", "b", "no_blocks", "waiting", 3, 4, None),
        (2, "wait", "b", "no_blocks", "waiting", 3, 3, None),
    ]
    why = WaitReasons(log.events, log.steps, log.requests)
    assert runs(why, "c", "waiting", 0, 2, 0.0) == [
        ("behind", 0, 2, {"behind:no_blocks": 3.0}, {"behind:no_blocks": [(3, 4), (3, 4), (3, 3)]}, ["b"])
    ]
    assert why.step_reason("waiting", 1) == ("behind:no_blocks", "b", None)


def test_the_delay_gate_with_its_numbers_and_a_mid_step_arrival(tmp_path):
    log = run(tmp_path, [req("a", 4, 3), req("b", 4, 1, arrival=0.5)], delay_factor=1.0)
    held = log.events[log.events.event == "held"]
    # step 1 begins at t=1: b has waited 0.5 s, not more than 1.0 × the last prompt step (1 s): gate closed
    assert (held.step.tolist(), held.reason.tolist()) == ([1], ["delay gate"])
    assert held.detail.tolist() == ["waited_s=0.5 limit_s=1 delay_factor=1 last_prompt_latency_s=1"]
    why = WaitReasons(log.events, log.steps, log.requests)
    table = why.time_by_reason().set_index(["queue", "key"]).request_s.to_dict()
    assert table[("waiting", "arrival")] == 0.5 and table[("waiting", "held:delay gate")] == 1.0
    (stretch,) = why.reason_runs("b", "waiting", 1, 1, 1.0)
    assert (stretch.key, stretch.details) == ("held:delay gate", list(held.detail))


def test_swap_preemption_swap_first_and_swap_in_later(tmp_path):
    log = run(tmp_path, [req("a", 8, 6), req("b", 8, 4, n=2), req("c", 4, 1, arrival=1.5)], num_gpu_blocks=6)
    assert rows(log.events, "preempted", "swapped_in", "held")[:3] == [
        # step 1: b's two sequences each need a block, one is free and a was already scheduled: b itself goes, by swap
        # (n=2)
        (1, "preempted", "b", "swap", "running", None, None, "b"),
        (
            2,
            "held",
            None,
            "swapped queue not empty",
            None,
            None,
            None,
            None,
        ),  # c arrived at 1.5: vllm-default admits nothing
        (3, "held", None, "swapped queue not empty", None, None, None, None),
    ]
    swap_ins = rows(log.events[(log.events.request_id == "b") & (log.events.queue == "swapped")])
    # b's 2 blocks come back with a spare per sequence: 4 needed; a holds 3 blocks (then 4 from its 13th token)
    assert swap_ins == [
        (s, "wait", "b", "no_blocks", "swapped", 4, free, None) for s, free in ((2, 3), (3, 3), (4, 3), (5, 2))
    ] + [(6, "swapped_in", "b", None, "swapped", 2, None, None)]
    why = WaitReasons(log.events, log.steps, log.requests)
    phases = all_phases(log.events, log.requests, why.start, why.end)
    # b sampled its first token at the end of step 0 and was swapped out before its second
    assert [(p.kind, p.first_step, p.last_step, p.detail) for p in phases["b"]] == [
        ("prefill", 0, 0, ""),
        ("swapped", 1, 5, "swap, for b"),
        ("decode", 6, 9, ""),
    ]
    assert [(p.kind, p.first_step, p.last_step) for p in phases["c"]] == [("queued", 2, 6), ("prefill", 7, 7)]
    assert runs(why, "c", "waiting", 2, 6, 2.0) == [
        ("held:swapped queue not empty", 2, 6, {"held:swapped queue not empty": 5.0}, {}, [])
    ]


def test_recompute_and_an_ignored_prompt(tmp_path):
    log = run(
        tmp_path,
        [req("a", 8, 6), req("b", 8, 4), req("x", 40, 2), req("c", 4, 1, arrival=1.5)],
        num_gpu_blocks=5,
        max_model_len=32,
    )
    assert rows(log.events, "preempted", "ignored") == [
        (0, "ignored", "x", None, "waiting", None, None, None),
        (1, "preempted", "b", "recompute", "running", None, None, "b"),
    ]
    assert log.events.detail[log.events.event == "ignored"].tolist() == ["40 tokens exceed max_model_len (32)"]
    again = log.events[(log.events.request_id == "b") & (log.events.event == "admitted")]
    assert again.step.tolist() == [0, 6] and again.tokens.tolist() == [8, 9]  # re-prefilled with its first output token


class LeavesRunningOut:
    """A test policy that leaves running requests out on purpose, so that the log must say so: on odd
    steps it advances the decodes only (the decode lane, where it can) and leaves prompts in the middle
    of a chunked prefill waiting; on even steps it advances every other running request, one by one.
    Then it swaps in and admits what fits, in chunks of 8 tokens."""

    def __init__(self) -> None:
        self.steps = 0

    @hookimpl
    def select_batch(self, step):
        self.steps += 1
        if self.steps % 2:
            step.advance_decodes()
        else:
            for i, group in enumerate(step.running):
                if i % 2 == 0 and not step.was_touched(group) and step.advance(group, max_tokens=8) is Outcome.BUDGET:
                    break
        for queue, operation in ((step.swapped, step.swap_in), (step.waiting, step.admit)):
            for group in queue:
                if operation(group, max_tokens=8 if group.num_seqs == 1 else None) in (Outcome.LATER, Outcome.BUDGET):
                    break
        return True


def _workloads():
    """Small random workloads and configs that queue, preempt (both ways), chunk and ignore."""
    request = st.builds(
        lambda i, p, o, t, n: req(f"r{i}", p, o, arrival=t, n=n),
        st.just(0),
        st.integers(1, 60),
        st.integers(1, 30),
        st.floats(0, 8).map(lambda t: round(t, 2)),
        st.sampled_from([1, 1, 1, 1, 2]),
    )
    return st.tuples(
        st.lists(request, min_size=1, max_size=14).map(
            lambda rs: [r.model_copy(update={"request_id": f"r{i}"}) for i, r in enumerate(rs)]
        ),
        st.sampled_from(["vllm-default", "fcfs", "sarathi", "sjf", LeavesRunningOut]),
        st.fixed_dictionaries(
            {
                "num_gpu_blocks": st.integers(10, 40),
                "max_num_batched_tokens": st.sampled_from([32, 64, 256]),
                "max_num_seqs": st.integers(1, 8),
                "preemption_mode": st.sampled_from([None, "swap", "recompute"]),
                "delay_factor": st.sampled_from([0.0, 0.5]),
            }
        ),
    )


@settings(max_examples=25, deadline=None)
@given(_workloads())
def test_the_log_adds_up(tmp_path_factory, case):
    """Whatever the policy and the pressure: the log is the same with and without the decode lane;
    its waiting time adds up to each request's time in the queues; and the inter-token gaps replayed
    from it add up, request by request, to the time from first to last token."""
    requests, policy, config = case
    logs = [run(tmp_path_factory.mktemp("log"), requests, policy, decode_lane=lane, **config) for lane in (True, False)]
    pd.testing.assert_frame_equal(logs[0].events, logs[1].events)
    log = logs[0]
    why = WaitReasons(log.events, log.steps, log.requests)
    table = why.time_by_reason()
    phases = all_phases(log.events, log.requests, why.start, why.end)
    in_queues = sum(
        p.end_s - p.start_s for ps in phases.values() for p in ps if p.kind in ("queued", "preempted", "swapped")
    )
    attributed = (
        table[table.queue != "running"].request_s.sum() + table[table.key.str.startswith("preempted_")].request_s.sum()
    )
    assert attributed == pytest.approx(in_queues, abs=1e-6)
    gaps, counts = inter_token_latencies(log.events, log.steps)
    done = log.requests[log.requests.status.isin(["FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED"])]
    # a request ignored after a preemption streamed tokens, but its last one's time is in no file: count only finished
    # ones
    assume(not (log.requests.first_token_time.notna() & (log.requests.status == "FINISHED_IGNORED")).any())
    assert (gaps * counts).sum() == pytest.approx((done.finish_time - done.first_token_time).sum(), abs=1e-6)
    if (done.n == 1).all():  # one stream per request: a gap before each token after the first
        assert counts.sum() == (done.output_tokens - 1).sum()
    assert (gaps >= 0).all() and np.all(np.diff(gaps) > 0)


def test_a_request_arriving_as_a_step_starts_is_placed_as_the_engine_placed_it(tmp_path):
    """Steps of one second from 0.69 s start at 4.6899999999999995 s by the engine's float clock, so a
    request arriving at 4.69 s waits for the next step; a start recomputed as end - duration (5.69 - 1)
    cannot tell, and lost that second of its wait. The time series keeps the engine's own start."""
    requests = [req("r2", 1, 6, arrival=0.69), req("r0", 1, 1, arrival=1.0), req("r1", 1, 1, arrival=4.69)]
    log = run(tmp_path, requests, max_num_seqs=1, delay_factor=0.0)
    assert log.steps.start_s[4] == 0.69 + 1.0 + 1.0 + 1.0 + 1.0 < 4.69
    why = WaitReasons(log.events, log.steps, log.requests)
    table = why.time_by_reason().set_index("key").request_s
    assert table["arrival"] == pytest.approx(0.69 + 1.0)  # r0 arrived 0.69 s before step 1, r1 a second before step 5
    assert table.sum() == pytest.approx((6.69 - 1.0) + (7.69 - 4.69))  # every second r0 and r1 spent queued
