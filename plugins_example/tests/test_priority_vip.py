"""priority-vip's own tests: its rules on small scenarios, then kvsched's conformance suite on it."""

from __future__ import annotations

import pytest
from kvsched_priority_vip import PriorityVip

from kvsched import CostProfile, Engine, EngineConfig, Request, SamplingParams, SimulatedExecutor
from kvsched.testing import PolicyConformance
from kvsched.testing.starvation import run_overload
from kvsched.testing.strategies import OverloadScenario

UNIT = CostProfile(
    name="unit",
    base_ms=1000,
    prefill_token_ms=0,
    decode_seq_ms=0,
    kv_token_ms=0,
    kv_bytes_per_token=0,
    swap_gb_per_s=1,
    copy_gb_per_s=1,
)


def engine(policy=None, **config) -> Engine:
    """One simulated second per step, audited after every step."""
    cfg = EngineConfig(
        **{
            "block_size": 4,
            "num_gpu_blocks": 64,
            "num_cpu_blocks": 64,
            "watermark": 0.0,
            "max_num_batched_tokens": 256,
            "max_num_seqs": 64,
            "audit_every_step": True,
            **config,
        }
    )
    return Engine(cfg, policy or PriorityVip(), SimulatedExecutor(UNIT))


def req(rid, priority=0, tenant="default", prompt=8, out=4, arrival=0.0):
    return Request(
        request_id=rid,
        prompt_len=prompt,
        output_len=out,
        priority=priority,
        tenant=tenant,
        arrival_time=arrival,
        sampling=SamplingParams(max_tokens=out),
    )


def admitted(report):
    return [s.group.request_id for s in report.output.scheduled if s.is_prefill]


def test_admits_vip_then_priority_order_fcfs_within_a_level():
    eng = engine(PriorityVip(aging_s=0))
    for r in (req("low", 5), req("mid-1", 1), req("vip", 3, tenant="vip"), req("mid-2", 1), req("urgent", 0)):
        eng.add_request(r)
    # vip: 3 - 4 = -1; then urgent (0); then the two level-1 requests in arrival order; low last
    assert admitted(eng.step()) == ["vip", "urgent", "mid-1", "mid-2", "low"]


def test_aging_lets_a_waiting_request_overtake_fresh_vips():
    policy = PriorityVip(aging_s=1.0)
    eng = engine(policy, max_num_seqs=1)
    eng.add_request(req("first", out=30))
    eng.step()
    eng.add_request(req("old-low", priority=2, arrival=0.0))
    order = []
    for _ in range(150):  # a VIP arrives every step: three times faster than they are served
        eng.add_request(req(f"vip-{len(order)}-{eng.num_steps}", tenant="vip", arrival=eng.clock.now(), out=2))
        order += admitted(eng.step())
        if "old-low" in order:
            break
    assert "old-low" in order  # without aging it would wait behind every VIP (see the next test)


def test_without_aging_a_low_priority_request_starves_under_vip_overload():
    scenario = OverloadScenario(seed=1, victim_priority=2, victim_prompt=96, victim_output=48, overload=1.3)
    assert run_overload(PriorityVip(aging_s=0), scenario).starved
    assert not run_overload(PriorityVip(), scenario).starved


def test_preempts_the_least_urgent_newest_group():
    eng = engine(PriorityVip(aging_s=0), num_gpu_blocks=10, max_num_seqs=8)
    eng.add_request(req("vip", tenant="vip", prompt=7, out=20))
    eng.add_request(req("low-old", priority=3, prompt=7, out=20))
    eng.add_request(req("low-new", priority=3, prompt=7, out=20, arrival=0.5))
    victims = []
    eng.run(on_step=lambda r: victims.extend(g.request_id for g, _ in r.output.preempted))
    assert victims and victims[0] == "low-new"
    assert "vip" not in victims
    assert eng.leaked_blocks == 0


def test_never_preempts_a_more_urgent_group_for_a_less_urgent_one():
    policy = PriorityVip(aging_s=0)
    eng = engine(policy, num_gpu_blocks=8, max_num_seqs=8)  # room for one of the two to finish, not both
    eng.add_request(req("vip", tenant="vip", prompt=7, out=20))
    eng.add_request(req("low", priority=3, prompt=7, out=20))
    eng.step()
    seen = []
    eng.run(on_step=lambda r: seen.extend((g.request_id, r.step) for g, _ in r.output.preempted))
    assert seen and all(rid == "low" for rid, _ in seen)  # the low group yields itself, never the VIP


def test_options_come_from_the_cli_as_strings():
    policy = PriorityVip(vip_tenants="gold, platinum", vip_boost="2", aging_s="0")
    assert policy.vip_tenants == {"gold", "platinum"} and policy.vip_boost == 2 and policy.aging_s == 0
    with pytest.raises(ValueError):
        PriorityVip(aging_s=-1)


def test_respects_the_delay_gate():
    eng = engine(delay_factor=100.0)
    eng.add_request(req("a", out=10))
    eng.step()
    eng.add_request(req("b", arrival=eng.clock.now()))
    assert admitted(eng.step()) == []  # something runs and b has not waited 100 × the last prompt step


class TestConformance(PolicyConformance):
    """kvsched's suite: universal invariants plus the two claims priority-vip declares."""

    policy = PriorityVip
