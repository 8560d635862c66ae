"""Greedy outputs of our engine equal transformers' generate() token for token, for each tiny family.

Each scenario must also really exercise its mechanism (preemptions happened, blocks were
copied, prefix tokens were reused, prefill and decode shared a step), otherwise a pass proves nothing.
"""

from __future__ import annotations

import pytest
import torch

from kvsched.executors.hf_models import load_model
from kvsched.executors.hf_verify import scenarios, verify
from tests.kernel_cases import interpreted_triton

FAMILIES = ["tiny-llama", "tiny-qwen2", "tiny-gpt2"]
SCENARIOS = list(scenarios(12, [3]))


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module", params=FAMILIES)
def results(request):
    loaded = load_model(request.param)
    return {r.scenario: r for r in verify(loaded, max_new_tokens=12)}


def _explain(result) -> str:
    bad = [c for c in result.checks if not c.ok]
    return "; ".join(
        f"{c.request_id}/{c.sample}: first mismatch at {c.first_mismatch} (reference top-2 margin {c.margin}), "
        f"max logit diff {c.max_logit_diff}, expected {c.expected} got {c.got}"
        for c in bad
    )


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_greedy_equals_generate(results, scenario):
    result = results[scenario]
    assert result.checks, "no sequence was compared"
    assert result.ok, _explain(result)


def test_each_scenario_exercises_its_mechanism(results):
    assert results["mixed"].mixed_steps > 0
    assert results["chunked"].mixed_steps > results["mixed"].mixed_steps  # chunks spread prompts over more steps
    assert results["recompute"].preemptions[0] > 0 and results["recompute"].preemptions[1] == 0
    assert results["swap"].preemptions[1] > 0
    assert results["n3-cow"].blocks_copied > 0 and len(results["n3-cow"].checks) == 3 * 4
    assert results["n3-swap"].preemptions[1] > 0 and results["n3-swap"].blocks_copied > 0
    assert results["prefix"].cached_tokens > 0
    assert results["v1"].cached_tokens > 0 and len(results["v1"].checks) == 2 * 4  # its pool is a block short


def test_logits_match_within_tolerance(results):
    worst = max(c.max_logit_diff for r in results.values() for c in r.checks if c.max_logit_diff is not None)
    assert worst < 1e-4


def test_triton_backend_end_to_end_under_interpreter():
    """The Triton kernel (interpreted on CPU) drives a short mixed prefill/decode run, token-exact."""
    restore = interpreted_triton()
    try:
        loaded = load_model("tiny-llama")
        prompts = [[5, 9, 200, 31, 7], [44, 3]]
        (result,) = verify(loaded, ["mixed"], max_new_tokens=3, backend="triton", prompts=prompts)
    finally:
        restore()
    assert result.mixed_steps > 0
    assert result.ok, _explain(result)
