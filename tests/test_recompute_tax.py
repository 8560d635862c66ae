"""The recompute tax (metrics/recompute.py): tokens thrown away by preemptions by recompute, those
computed again, and every token computed, per request and per run."""

from __future__ import annotations

from helpers import make_group, req, unit_engine

from kvsched.metrics.recompute import FIELDS, recompute_summary
from kvsched.metrics.requests import FIELDS as RECORD_FIELDS
from kvsched.metrics.requests import RequestMetrics, summarize
from kvsched.policies.vllm_v1 import VllmV1


def _run(policy=None, **config):
    """a (40 tokens), b (5) and c (21) fill 19 blocks; a's first decode needs one, so V1 preempts c (the tail).
    Without prefix caching unless asked (vllm-v1 turns it on, as vLLM V1 does): the tax it saves is tested apart."""
    eng = unit_engine(policy or VllmV1(), num_gpu_blocks=19, **{"enable_prefix_caching": False, **config})
    for rid, n in (("a", 40), ("b", 5), ("c", 21)):
        eng.add_request(req(rid, n, 6))
    eng.run([])
    return eng, {g.request_id: RequestMetrics.of(g) for g in eng.finished}


def test_a_recompute_throws_away_what_the_victim_had_computed_and_computes_it_again():
    eng, m = _run()
    assert (m["c"].preemptions_recompute, m["c"].discarded_tokens, m["c"].recomputed_tokens) == (1, 21, 21)
    # c computed its 21 prompt tokens twice, then decoded 5 more tokens (its 6th is sampled, never computed)
    assert m["c"].computed_tokens == 21 + 21 + 5
    assert (m["a"].computed_tokens, m["a"].recomputed_tokens, m["a"].discarded_tokens) == (40 + 5, 0, 0)
    tax = summarize(eng, list(m.values()))["recompute"]
    assert tax["recomputed_tokens"] == 21 and tax["computed_tokens"] == 45 + 10 + 47
    assert tax["tax"] == 21 / 102 and tax["discarded_per_preemption"] == 21.0


def test_prefix_cache_hits_are_not_recomputed():
    _, m = _run(enable_prefix_caching=True)
    c = m["c"]
    assert c.discarded_tokens == 21
    assert c.recomputed_tokens < 21  # its freed full blocks were found again in the cache
    assert c.computed_tokens == 21 + c.recomputed_tokens + 5


def test_a_second_preemption_before_the_recompute_is_done_counts_only_what_was_recomputed():
    g = make_group(range(8))
    g.note_admission(0)
    g.note_recompute(100)  # lost 100 computed tokens
    g.note_admission(30)  # 30 found in the cache: 70 to compute again
    assert g.num_recomputed_tokens == 70
    g.note_recompute(60)  # preempted again at 60: only 30..60 were recomputed
    assert (g.num_recomputed_tokens, g.num_discarded_tokens, g.recompute_frontier) == (30, 160, 100)
    g.note_admission(0)
    assert g.num_recomputed_tokens == 130  # 0..100 again


def test_a_swap_throws_nothing_away():
    eng = unit_engine("vllm-default", num_gpu_blocks=19, preemption_mode="swap")
    for rid, n in (("a", 40), ("b", 5), ("c", 21)):
        eng.add_request(req(rid, n, 6))
    eng.run([])
    m = [RequestMetrics.of(g) for g in eng.finished]
    assert sum(r.preemptions_swap for r in m) > 0
    assert all(r.discarded_tokens == r.recomputed_tokens == 0 for r in m)
    assert recompute_summary(m)["tax"] == 0.0 and recompute_summary(m)["discarded_per_preemption"] is None


def test_the_counts_are_request_columns():
    assert set(FIELDS) <= set(RECORD_FIELDS)
