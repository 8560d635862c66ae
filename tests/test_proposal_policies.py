"""The vLLM proposals' policies (issue 23): each rule on a small situation where it differs from
vllm-v1's FCFS (and from its neighbours), then the conformance suite for each (one-second steps)."""

from __future__ import annotations

import pytest
from helpers import req, unit_engine

from kvsched.core.request import Request, SamplingParams
from kvsched.policies.cache_affinity import CacheAffinity
from kvsched.policies.ewsjf import Ewsjf
from kvsched.policies.hrrn import Hrrn
from kvsched.policies.lcf import Lcf
from kvsched.policies.residual_sjf import ResidualSjf
from kvsched.policies.session_affinity import SessionAffinity
from kvsched.policies.sjf_aging import SjfAging
from kvsched.policies.sla_tiers import SlaTiers
from kvsched.policies.vllm_v1 import VllmV1
from kvsched.testing import PolicyConformance

PROPOSALS = [Lcf, ResidualSjf, SessionAffinity, CacheAffinity, Ewsjf, SjfAging, SlaTiers, Hrrn]


def tokens(start: int, n: int, **kw) -> dict:
    """Prompt token ids start..start+n-1 (equal ranges share their cached blocks)."""
    return dict(prompt_token_ids=tuple(range(start, start + n)), **kw)


def ask(rid: str, output_len: int = 2, arrival: float = 0.0, **kw) -> Request:
    return Request(
        request_id=rid,
        output_len=output_len,
        arrival_time=arrival,
        sampling=SamplingParams(max_tokens=output_len),
        **kw,
    )


def admitted(report) -> list[str]:
    return [s.group.request_id for s in report.output.scheduled if s.is_prefill]


def first_admitted(policy, waiting, warm=(), **config) -> str:
    """Run ``warm`` to completion, one at a time (their prompts stay in the prefix cache, and the clock
    moves on), queue ``waiting`` (built with the clock: ``waiting(now)``), and return the request the
    policy admits first when one sequence at a time may run."""
    eng = unit_engine(policy, max_num_seqs=1, enable_prefix_caching=True, **config)
    for r in warm:
        eng.add_request(r)
    while eng.has_unfinished():
        eng.step()
    for r in waiting(eng.now):
        eng.add_request(r)
    while True:
        got = admitted(eng.step())
        if got:
            return got[0]


def pause(seconds: int, rid: str = "pause") -> Request:
    """A one-token prompt that decodes for ``seconds`` one-second steps: the clock moves on."""
    return ask(rid, output_len=seconds, prompt_len=1)


# -------------------------------------------------------------------------------------------- lcf
@pytest.mark.parametrize(("victim", "expected"), [("lifo", "c"), ("lcf", "b"), ("mcf", "c")])
def test_lcf_evicts_the_running_request_with_the_fewest_computed_tokens(victim, expected):
    """a (40 tokens), b (5) and c (21) fill the pool exactly; a's first decode needs a block. V1's tail
    rule (lifo) takes c; lcf the least computed other than a, b; mcf the most computed, c."""
    eng = unit_engine(Lcf(victim=victim), num_gpu_blocks=19)
    for rid, n in (("a", 40), ("b", 5), ("c", 21)):
        eng.add_request(req(rid, n, 6))
    assert admitted(eng.step()) == ["a", "b", "c"]
    out = eng.step().output
    assert [g.request_id for g, _ in out.preempted] == [expected]


def test_lcf_lifo_is_vllm_v1s_own_victim_rule():
    victims = []
    for policy in (Lcf(victim="lifo"), VllmV1()):
        eng = unit_engine(policy, num_gpu_blocks=19)
        for rid, n in (("a", 40), ("b", 5), ("c", 21)):
            eng.add_request(req(rid, n, 6))
        victims.append([[g.request_id for g, _ in eng.step().output.preempted] for _ in range(12)])
    assert victims[0] == victims[1]


def test_lcf_rejects_an_unknown_victim_rule():
    with pytest.raises(ValueError, match="victim must be one of"):
        Lcf(victim="oldest")


# ------------------------------------------------------------------- residual-sjf, sjf-aging, hrrn
def _cold_then_warm(now):
    return [ask("cold", arrival=now, **tokens(1000, 12)), ask("warm", arrival=now, **tokens(0, 44))]


WARM = [ask("seed", **tokens(0, 40))]  # leaves 40 tokens of "warm"'s prompt in the cache


def test_residual_sjf_counts_only_what_the_prefix_cache_does_not_hold():
    assert first_admitted(ResidualSjf(), _cold_then_warm, warm=WARM) == "warm"  # 1 block left vs 3
    assert first_admitted(SjfAging(), _cold_then_warm, warm=WARM) == "cold"  # raw length: 12 < 44
    assert first_admitted(VllmV1(), _cold_then_warm, warm=WARM) == "cold"  # queue order


def _old_long_new_short(now):  # "long" arrived at 0 (it has waited ``now`` seconds), "short" has just come
    return [ask("long", arrival=0.0, prompt_len=40), ask("short", arrival=now, prompt_len=4)]


def test_residual_sjf_promotes_a_straggler_past_its_max_wait():
    assert first_admitted(ResidualSjf(max_wait_ms=5_000), _old_long_new_short, warm=[pause(8)]) == "long"
    assert first_admitted(ResidualSjf(max_wait_ms=60_000), _old_long_new_short, warm=[pause(8)]) == "short"


def _long_then_short(now):
    return [ask("long", arrival=now, prompt_len=40), ask("short", arrival=now, prompt_len=4)]


@pytest.mark.parametrize("policy", [SjfAging, Hrrn, ResidualSjf])
def test_the_sjf_family_admits_the_shorter_of_two_equal_waits(policy):
    assert first_admitted(policy(), _long_then_short, warm=[pause(2)]) == "short"
    assert first_admitted(VllmV1(), _long_then_short, warm=[pause(2)]) == "long"


def test_hrrn_and_sjf_aging_let_a_long_wait_outweigh_a_short_prompt():
    """long waited 8 s (service 40 / 10 = 4 s: ratio 3); short has just come (ratio 1)."""
    warm = [pause(8)]
    assert first_admitted(Hrrn(prefill_tokens_per_s=10), _old_long_new_short, warm=warm) == "long"
    assert first_admitted(Hrrn(prefill_tokens_per_s=10_000), _old_long_new_short, warm=warm) == "long"
    assert first_admitted(SjfAging(time_median=1.0), _old_long_new_short, warm=warm) == "long"
    assert first_admitted(SjfAging(time_median=1e6), _old_long_new_short, warm=warm) == "short"


# ------------------------------------------------------------------------------ cache-affinity
def test_cache_affinity_admits_the_warm_request_within_its_window_only():
    assert first_admitted(CacheAffinity(), _cold_then_warm, warm=WARM) == "warm"
    assert first_admitted(CacheAffinity(window_k=1), _cold_then_warm, warm=WARM) == "cold"


# ---------------------------------------------------------------------------------------- ewsjf
def test_ewsjf_serves_the_short_prompt_queue_first_then_the_one_it_passed_over():
    def queue(now):
        return [ask("long", arrival=now, prompt_len=200), ask("short", arrival=now, prompt_len=8)]

    assert first_admitted(Ewsjf(edges="64"), queue) == "short"
    assert first_admitted(VllmV1(), queue) == "long"
    # one prompt-length queue for both: FCFS inside it
    assert first_admitted(Ewsjf(edges="1000"), queue) == "long"


def test_ewsjf_reads_edges_from_an_option_string():
    assert Ewsjf(edges="64, 8").edges == (8, 64)


# ----------------------------------------------------------------------------- session-affinity
TURN1 = [ask("s1-turn1", session_id="s1", **tokens(0, 40))]


def _other_then_turn2(now):
    return [
        ask("other", arrival=now, session_id="s2", **tokens(5000, 12)),
        ask("s1-turn2", arrival=now, session_id="s1", **tokens(0, 48)),
    ]


def test_session_affinity_promotes_the_warm_continuation_of_a_recent_session():
    assert first_admitted(SessionAffinity(), _other_then_turn2, warm=TURN1) == "s1-turn2"
    assert first_admitted(VllmV1(), _other_then_turn2, warm=TURN1) == "other"


def test_session_affinity_is_bounded_by_the_heads_wait_and_by_the_session_ttl():
    assert (
        first_admitted(
            SessionAffinity(max_head_wait_s=0.0),
            lambda now: [
                ask("other", arrival=now - 1.0, session_id="s2", **tokens(5000, 12)),
                ask("s1-turn2", arrival=now, session_id="s1", **tokens(0, 48)),
            ],
            warm=TURN1,
        )
        == "other"
    )
    assert first_admitted(SessionAffinity(session_ttl_s=1.0), _other_then_turn2, warm=[*TURN1, pause(3)]) == "other"


def test_session_affinity_needs_a_cached_prefix():
    cold = [ask("s1-turn1", session_id="s1", **tokens(9000, 40))]  # same session, unrelated prompt
    assert first_admitted(SessionAffinity(), _other_then_turn2, warm=cold) == "other"


# ------------------------------------------------------------------------------------ sla-tiers
def test_sla_tiers_admit_by_tier_then_arrival():
    def queue(now):
        return [
            ask("bg", arrival=now, prompt_len=4, slo_class="background"),
            ask("plain", arrival=now, prompt_len=4),
            ask("chat", arrival=now, prompt_len=4, slo_class="interactive"),
        ]

    assert first_admitted(SlaTiers(), queue) == "chat"
    assert first_admitted(SlaTiers(), lambda now: queue(now)[:2]) == "plain"  # no tier: batch, ahead of background


def test_sla_tiers_preempt_the_least_urgent_tier_and_never_a_more_urgent_one():
    eng = unit_engine(SlaTiers(), num_gpu_blocks=19)
    for rid, n, tier in (("a", 40, "batch"), ("b", 5, "background"), ("c", 21, "interactive")):
        eng.add_request(req(rid, n, 6, slo_class=tier))
    eng.step()
    assert [g.request_id for g, _ in eng.step().output.preempted] == ["b"]  # V1's tail would be c
    eng = unit_engine(SlaTiers(), num_gpu_blocks=19)
    for rid, n, tier in (("a", 40, "background"), ("b", 5, "interactive"), ("c", 21, "interactive")):
        eng.add_request(req(rid, n, 6, slo_class=tier))
    eng.step()
    assert [g.request_id for g, _ in eng.step().output.preempted] == ["a"]  # a gives way itself


def test_sla_tiers_cap_the_interactive_prompt_tokens_of_a_step():
    eng = unit_engine(SlaTiers(max_interactive_batch_tokens=8), max_num_batched_tokens=64)
    for rid, tier in (("i1", "interactive"), ("i2", "interactive"), ("b1", "batch")):
        eng.add_request(req(rid, 8, 2, slo_class=tier))
    assert admitted(eng.step()) == ["i1", "b1"]


# ---------------------------------------------------------------------------------- conformance
@pytest.mark.parametrize("policy", PROPOSALS, ids=lambda p: p.name)
class TestProposalConformance(PolicyConformance):
    max_examples = 15
    stateful_steps = 20
    starvation_examples = 2

    @pytest.fixture(autouse=True)
    def _bind(self, policy):
        self.policy = policy
