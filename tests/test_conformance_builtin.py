"""Every built-in policy passes the conformance suite, through the same base class plugin authors use."""

from __future__ import annotations

import pytest

from kvsched.testing import PolicyConformance


@pytest.mark.parametrize("name", ["vllm-default", "fcfs", "sarathi", "sjf", "vtc", "lpm"])
class TestBuiltinPolicies(PolicyConformance):
    max_examples = 25
    stateful_steps = 25

    @pytest.fixture(autouse=True)
    def _bind(self, name):
        self.policy = name


class TestSarathiSmallBudget(PolicyConformance):
    """Chunking every prompt hard (a 16-token budget) is where chunked prefill goes wrong."""

    policy = "sarathi"
    policy_options = {"token_budget": "16"}
    max_examples = 25
    stateful_steps = 25


class TestSjfNoisyPredictor(PolicyConformance):
    policy = "sjf"
    policy_options = {"predictor": "noisy", "sigma": "1.0"}
    max_examples = 20
    stateful_steps = 25
