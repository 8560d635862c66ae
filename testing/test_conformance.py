"""The suite as pytest collects it: ``pytest --pyargs kvsched.testing --policy NAME [--policy OTHER]``."""

from __future__ import annotations

import pytest

from kvsched.testing.base import PolicyConformance
from kvsched.testing.pytest_plugin import policy_options


class TestPolicy(PolicyConformance):
    """One parametrized copy of every conformance test per ``--policy``."""

    @pytest.fixture(autouse=True)
    def _bind(self, kvsched_policy, request):
        self.policy = kvsched_policy
        self.policy_options = policy_options(request.config) or None
