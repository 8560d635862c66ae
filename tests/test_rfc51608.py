"""kvsched.rfc51608: policies written to vLLM RFC #51608's QueueSort / Filter / Score / Preemption-key
extension points run on kvsched's hooks unchanged (one-second steps)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import req, unit_engine
from test_proposal_policies import admitted, first_admitted

from kvsched import PolicyError
from kvsched.policies.vllm_v1 import VllmV1
from kvsched.rfc51608 import SKIPPED, WAITING, Reject, Rfc51608
from kvsched.testing import PolicyConformance

EXAMPLE = str(Path(__file__).resolve().parents[1] / "docs" / "examples" / "rfc51608_short_first.py") + ":ShortFirst"


def _trace(policy, num_gpu_blocks=19):
    eng = unit_engine(policy, num_gpu_blocks=num_gpu_blocks)
    for rid, n in (("a", 40), ("b", 5), ("c", 21), ("d", 9)):
        eng.add_request(req(rid, n, 6))
    steps = []
    while eng.has_unfinished():
        out = eng.step().output
        steps.append(
            ([(s.group.request_id, s.num_tokens) for s in out.scheduled], [g.request_id for g, _ in out.preempted])
        )
    return steps


def test_with_no_plugins_it_is_vllm_v1():
    assert _trace(Rfc51608()) == _trace(VllmV1())


def test_a_score_orders_the_candidates_higher_first():
    def queue(now):
        return [req("long", 40, 2, arrival=now), req("short", 4, 2, arrival=now)]

    assert first_admitted(Rfc51608(scorers=((lambda r, s: -r.prompt_len, 1.0),)), queue) == "short"
    assert first_admitted(Rfc51608(scorers=((lambda r, s: -r.prompt_len, -1.0),)), queue) == "long"


def test_a_rejected_request_waits_a_cycle_in_the_skipped_queue_which_goes_first():
    seen = []

    def reject_once(request, state):
        seen.append({c.request.request_id: c.queue for c in state.candidates})
        return Reject("not yet") if request.request_id == "x" and len(seen) == 1 else None

    eng = unit_engine(Rfc51608(filters=(reject_once,)), max_num_seqs=1)
    eng.add_request(req("x", 4, 1))
    eng.add_request(req("y", 4, 1))
    assert admitted(eng.step()) == ["y"]
    assert admitted(eng.step()) == ["x"]
    assert seen[-1] == {"x": SKIPPED}
    picks = []
    policy = Rfc51608(
        filters=(lambda r, s: Reject("hold") if r.request_id == "x" and not picks else None,),
        select_queue=lambda w, s: picks.append((w and w.request_id, s and s.request_id)) or WAITING,
    )
    eng = unit_engine(policy, max_num_seqs=1)
    for rid in ("x", "y", "z"):
        eng.add_request(req(rid, 4, 1))
    assert admitted(eng.step()) == ["y"] and admitted(eng.step()) == ["z"]  # select_queue kept taking WAITING
    assert ("z", "x") in picks  # both heads offered to select_queue


def test_the_largest_preemption_key_is_the_victim():
    lcf = Rfc51608(preemption_key=lambda request, position: -request.num_computed_tokens)
    eng = unit_engine(lcf, num_gpu_blocks=19)
    for rid, n in (("a", 40), ("b", 5), ("c", 21)):
        eng.add_request(req(rid, n, 6))
    eng.step()
    assert [g.request_id for g, _ in eng.step().output.preempted] == ["b"]  # V1's own tail would be c


@pytest.mark.parametrize(
    ("plugins", "message"),
    [
        ({"scorers": ((lambda r, s: float("nan"), 1.0),)}, "not a finite number"),
        ({"filters": (lambda r, s: "no",)}, "allow with None or True"),
    ],
)
def test_an_answer_the_rfc_does_not_allow_is_a_policy_error(plugins, message):
    eng = unit_engine(Rfc51608(**plugins))
    eng.add_request(req("a", 4, 2))
    with pytest.raises(PolicyError, match=message):
        eng.step()


def test_an_unknown_extension_point_is_refused():
    with pytest.raises(ValueError, match="unknown RFC #51608 extension point 'reserve'"):
        Rfc51608(reserve=lambda r, s: None)


class TestTheExampleConforms(PolicyConformance):
    policy = EXAMPLE
    max_examples = 15
    stateful_steps = 20
    starvation_examples = 2
