"""The rule of each built-in research policy, on small hand-made scenarios (one-second steps)."""

from __future__ import annotations

import pytest
from helpers import ids, req, unit_engine

from kvsched import Engine, EngineConfig, PolicyError, SimulatedExecutor
from kvsched.core.request import Request, SamplingParams
from kvsched.plugins.discovery import available_policies
from kvsched.policies.length_predictors import (
    BucketedPredictor,
    HistoryPredictor,
    NoisyOraclePredictor,
    OraclePredictor,
    make_predictor,
)
from kvsched.policies.sjf import Sjf
from kvsched.policies.vtc import Vtc


def scheduled(report):
    return [(s.group.request_id, s.num_tokens, s.is_prefill) for s in report.output.scheduled]


def test_every_builtin_is_an_entry_point_of_kvsched():
    found = available_policies()
    for name in ("vllm-default", "fcfs", "sarathi", "sjf", "vtc", "lpm"):
        assert found[name].distribution == "kvsched", name


# ----------------------------------------------------------------------------------------- fcfs
def test_fcfs_mixes_decodes_and_new_prompts_in_arrival_order():
    eng = unit_engine("fcfs")
    eng.add_request(req("a", 8, 4))
    eng.step()
    eng.add_request(req("c", 8, 4, arrival=0.5))
    eng.add_request(req("b", 8, 4, arrival=0.2))
    # queue order is submission order; fcfs admits in queue order next to the running decode
    assert scheduled(eng.step()) == [("a", 1, False), ("c", 8, True), ("b", 8, True)]


def test_fcfs_head_of_line_blocks_later_prompts():
    eng = unit_engine("fcfs", max_num_batched_tokens=64, max_num_seqs=8)
    eng.add_request(req("big", 60, 2))
    eng.add_request(req("small", 8, 2))
    eng.step()
    eng.add_request(req("next", 60, 2))
    eng.add_request(req("tiny", 2, 2))
    step = scheduled(eng.step())
    assert ("tiny", 2, True) not in step  # "next" does not fit the budget left, so nothing behind it goes


# -------------------------------------------------------------------------------------- sarathi
def test_sarathi_chunks_a_long_prompt_and_never_pauses_decodes():
    eng = unit_engine("sarathi", max_num_batched_tokens=256)
    eng.hooks.policy.token_budget = 32
    eng.add_request(req("short", 8, 6))
    assert scheduled(eng.step()) == [("short", 8, True)]
    eng.add_request(req("long", 100, 2))
    steps = [scheduled(eng.step()) for _ in range(4)]
    assert steps[0] == [("short", 1, False), ("long", 31, True)]
    assert steps[1] == [("short", 1, False), ("long", 31, True)]
    assert steps[2] == [("short", 1, False), ("long", 31, True)]
    assert steps[3] == [("short", 1, False), ("long", 7, True)]
    assert all(sum(n for _, n, _ in s) <= 32 for s in steps)
    eng.run()
    eng.check()
    assert eng.leaked_blocks == 0


def test_sarathi_continues_the_partial_prefill_before_new_prompts():
    eng = unit_engine("sarathi", max_num_batched_tokens=16, max_num_seqs=4, max_model_len=256)
    eng.add_request(req("p1", 40, 2))
    eng.add_request(req("p2", 4, 2))
    assert scheduled(eng.step()) == [("p1", 16, True)]
    assert scheduled(eng.step()) == [("p1", 16, True)]
    assert scheduled(eng.step()) == [("p1", 8, True), ("p2", 4, True)]


def test_sarathi_resumes_a_group_swapped_out_in_the_middle_of_its_prefill():
    eng = unit_engine("sarathi", max_num_batched_tokens=64, num_gpu_blocks=14, preemption_mode="swap")
    eng.hooks.policy.token_budget = 8
    eng.add_request(req("a", 12, 30))
    eng.step()
    eng.add_request(req("b", 40, 3, n=2))
    swapped = []
    eng.run(on_step=lambda r: swapped.extend(g.request_id for g, _ in r.output.preempted), max_steps=500)
    assert "b" in swapped  # a needed b's blocks while b was still prefilling
    assert not eng.has_unfinished() and eng.leaked_blocks == 0


def test_sarathi_rejects_a_bad_budget():
    with pytest.raises(PolicyError, match="token_budget"):
        Engine(EngineConfig(), "sarathi", SimulatedExecutor(), policy_options={"token_budget": "0"})


# ------------------------------------------------------------------------------------------ sjf
def test_sjf_admits_the_shortest_predicted_output_first():
    eng = unit_engine(Sjf(predictor="oracle"), max_num_seqs=1)
    for rid, out in (("long", 50), ("mid", 10), ("short", 3)):
        eng.add_request(req(rid, 4, out))
    assert ids(eng.step().output.scheduled) == ["short"]
    order = []
    eng.run(on_step=lambda r: order.extend(ids(s for s in r.output.scheduled if s.is_prefill)))
    assert order == ["mid", "long"]


def test_sjf_starvation_guard_puts_old_requests_first():
    eng = unit_engine(Sjf(predictor="oracle"), max_num_seqs=1)
    eng.hooks.policy.starvation_s = 2.5
    eng.add_request(req("long", 4, 40))
    eng.add_request(req("s0", 4, 3))
    eng.step()  # s0 admitted (shortest)
    for i in range(1, 4):
        eng.add_request(req(f"s{i}", 4, 3, arrival=float(i)))
    admitted = []
    eng.run(on_step=lambda r: admitted.extend(ids(s for s in r.output.scheduled if s.is_prefill)))
    assert admitted[0] == "long"  # waited > 2.5 s by the time s0 finished, so it beats s1..s3


def test_sjf_preempts_the_longest_remaining_job():
    eng = unit_engine("sjf", num_gpu_blocks=6, block_size=4, max_num_seqs=8)
    eng.add_request(req("long", 7, 40))
    eng.add_request(req("short", 7, 12))
    victims = []
    eng.run(on_step=lambda r: victims.extend(g.request_id for g, _ in r.output.preempted))
    assert victims and victims[0] == "long"
    assert eng.leaked_blocks == 0


def test_length_predictors():
    view = unit_engine().add_request(req("x", 4, 100, max_tokens=200)).view
    assert OraclePredictor().predict(view) == 100
    noisy = NoisyOraclePredictor(sigma=0.5, seed=3)
    assert noisy.predict(view) == noisy.predict(view) != 100  # fixed per request, not exact
    assert NoisyOraclePredictor(sigma=0.0).predict(view) == 100
    assert BucketedPredictor((64, 256)).predict(view) == 256
    assert BucketedPredictor("8,16").predict(view) == 32  # open top bucket: twice the last edge
    assert make_predictor("bucketed", edges="64,128").edges == (64, 128)
    with pytest.raises(ValueError, match="unknown length predictor"):
        make_predictor("psychic")
    with pytest.raises(TypeError):
        make_predictor(object())


def test_a_view_does_not_know_the_output_length():
    """The view exposed the workload's true length (``expected_output_len``), and so did its request copy: a policy
    reading either knew the future. Now only a named predictor reaches it."""
    view = unit_engine().add_request(req("x", 4, 100, max_tokens=200)).view
    assert not hasattr(view, "expected_output_len") and not hasattr(view.request, "output_len")
    assert view.max_tokens == 200 and view.request.sampling.max_tokens == 200  # the cap the client sent: known


def test_the_history_predictor_learns_only_from_finished_requests():
    history = HistoryPredictor(window=2)
    eng = unit_engine("fcfs")
    first = eng.add_request(req("a", 4, 10, max_tokens=200)).view
    assert history.predict(first) == 200  # nothing finished yet: the cap
    eng.add_request(req("b", 4, 30, max_tokens=200))
    eng.run()
    for group in eng.finished:
        history.observe(group.view)
    late = eng.add_request(req("c", 4, 40, max_tokens=50)).view
    assert history.predict(late) == 20 and history.predict(eng.add_request(req("d", 4, 1, max_tokens=8)).view) == 8
    assert history.name == "history(window=2)"


def test_sjf_accepts_a_predictor_object_and_cli_strings_and_names_it():
    class Reverse:
        name = "reverse"

        def predict(self, group):
            return -group.max_tokens

    assert (
        Sjf(predictor=Reverse()).predictor.__class__ is Reverse
        and Sjf(predictor=Reverse()).length_predictor == "reverse"
    )
    assert isinstance(Sjf(predictor="noisy", sigma=0.3).predictor, NoisyOraclePredictor)
    assert Sjf().length_predictor == "history(window=64)"  # the oracle is never the default
    with pytest.raises(TypeError, match="needs a name"):
        Sjf(predictor=type("Nameless", (), {"predict": lambda self, g: 1.0})())


def test_a_run_says_which_predictor_its_policy_used():
    from kvsched.experiments.simulation import SimJob
    from kvsched.workloads import build_workload

    load = build_workload(None, num_requests=30)
    assert SimJob(load, "sjf", record_timeseries=False).run().summary["length_predictor"] == "history(window=64)"
    oracle = SimJob(load, "sjf", policy_options={"predictor": "oracle"}, record_timeseries=False).run().summary
    assert oracle["length_predictor"] == "oracle"
    assert SimJob(load, "fcfs", record_timeseries=False).run().summary["length_predictor"] is None


# ------------------------------------------------------------------------------------------ vtc
def tenant_req(rid, tenant, prompt=8, out=4, arrival=0.0):
    return Request(
        request_id=rid,
        prompt_len=prompt,
        output_len=out,
        tenant=tenant,
        arrival_time=arrival,
        sampling=SamplingParams(max_tokens=out),
    )


def test_vtc_admits_from_the_least_served_tenant():
    eng = unit_engine("vtc", max_num_seqs=2)
    for i in range(3):
        eng.add_request(tenant_req(f"a{i}", "alice", arrival=0.0))
    eng.add_request(tenant_req("b0", "bob", arrival=0.1))
    # alice's first request is admitted (tie, earlier head), then bob's, although a1 arrived first
    assert ids(eng.step().output.scheduled) == ["a0", "b0"]
    counters = eng.hooks.policy.counters
    assert counters["alice"] == counters["bob"] == 8  # input weight 1 per prompt token


def test_vtc_counts_output_tokens_and_lifts_a_newly_backlogged_tenant():
    policy = Vtc(input_weight=1, output_weight=2)
    eng = unit_engine(policy, max_num_seqs=4)
    eng.add_request(tenant_req("a0", "alice", out=20))
    for _ in range(6):
        eng.step()
    assert policy.counters["alice"] == 8 + 2 * 5  # prompt, then five decode tokens
    eng.add_request(tenant_req("a1", "alice", arrival=eng.clock.now()))
    eng.add_request(tenant_req("b0", "bob", arrival=eng.clock.now()))
    eng.step()
    # bob was idle: he is lifted to the last served tenant's counter instead of keeping 0 credit
    assert policy.counters["bob"] >= 8 + 2 * 5


def test_vtc_shares_service_between_backlogged_tenants():
    eng = unit_engine("vtc", max_num_seqs=2, num_gpu_blocks=256)
    for i in range(30):
        eng.add_request(tenant_req(f"heavy{i}", "heavy", out=6))
    for i in range(6):
        eng.add_request(tenant_req(f"light{i}", "light", out=6))
    done = []
    eng.run(on_step=lambda r: done.extend(g.request_id for g in r.finished))
    first_twelve = done[:12]
    assert sum(r.startswith("light") for r in first_twelve) >= 5  # FCFS would serve light only after all heavy


# ------------------------------------------------------------------------------------------ lpm
def prefixed(rid, prefix, suffix_start, arrival=0.0):
    tokens = tuple(range(prefix * 1000, prefix * 1000 + 32)) + tuple(range(suffix_start, suffix_start + 4))
    return Request(
        request_id=rid,
        prompt_token_ids=tokens,
        output_len=2,
        arrival_time=arrival,
        sampling=SamplingParams(max_tokens=2),
    )


def cold_then_hit_behind_a_warm_prefix(max_queue: int | None = None):
    """LPM with prefix 1 cached by a finished request, then "cold" (prefix 2) and "hit" (prefix 1) waiting."""
    eng = unit_engine("lpm", enable_prefix_caching=True, max_num_seqs=1)
    if max_queue is not None:
        eng.hooks.policy.max_queue = max_queue
    eng.add_request(prefixed("warm", 1, 50_000))
    eng.run()
    eng.add_request(prefixed("cold", 2, 60_000, arrival=eng.clock.now()))
    eng.add_request(prefixed("hit", 1, 70_000, arrival=eng.clock.now()))
    return eng


def test_lpm_admits_the_longest_cached_prefix_first():
    assert ids(cold_then_hit_behind_a_warm_prefix().step().output.scheduled) == ["hit"]


def test_lpm_falls_back_to_fcfs_on_a_long_queue():
    assert ids(cold_then_hit_behind_a_warm_prefix(max_queue=1).step().output.scheduled) == ["cold"]


def test_lpm_computes_fewer_prefill_tokens_than_fcfs_on_shared_prompts():
    def prefill_tokens(policy):
        eng = unit_engine(policy, enable_prefix_caching=True, max_num_seqs=2, num_gpu_blocks=30)
        for i in range(48):  # eight system prompts, interleaved: more than the cache holds at once
            eng.add_request(prefixed(f"r{i}", i % 8, 100_000 + 10 * i))
        total = []
        eng.run(on_step=lambda r: total.extend(s.num_tokens for s in r.output.scheduled if s.is_prefill))
        assert eng.leaked_blocks == 0
        return sum(total)

    assert prefill_tokens("lpm") < prefill_tokens("fcfs")


# ----------------------------------------------------------------------------------------- docs
@pytest.mark.parametrize("name", ["fcfs", "sarathi", "sjf", "vtc", "lpm", "priority-vip"])
def test_every_policy_has_a_docs_page_with_its_rule_and_source(name):
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "policies" / f"{name}.md").read_text()
    assert "## Rule" in page and "## Source" in page and f"engine --policy {name}" in page
    assert f"`{name}`" in (Path(__file__).resolve().parents[1] / "docs" / "policies" / "README.md").read_text()


def test_vllm_v1_preempts_by_recompute_even_on_v0_mechanics():
    """V1 has no swap: on v0 mechanics (asked for explicitly) a swapped group would never be swapped
    back in by vllm-v1, and the run would stall; its victims are recomputed instead."""
    e = unit_engine("vllm-v1", vllm_engine="v0", num_gpu_blocks=8, preemption_mode=None)
    for i in range(4):
        e.add_request(req(f"r{i}", 4, 12, n=2))  # n > 1: the v0 default mode would be swap
    e.run()
    groups = e._groups.values()
    assert all(g.status.name in ("FINISHED_LENGTH_CAPPED", "FINISHED_STOPPED") for g in groups)
    assert sum(g.num_recompute_preemptions for g in groups) > 0 and not any(g.num_swap_preemptions for g in groups)
    assert e.leaked_blocks == 0
