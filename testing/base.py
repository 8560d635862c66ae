"""``PolicyConformance``: the base test class a policy author subclasses to run the suite in their own tests.

    from kvsched.testing import PolicyConformance
    from my_policy import MyPolicy

    class TestMyPolicy(PolicyConformance):
        policy = MyPolicy                  # or an installed name, "file.py:Attr", an instance
        policy_options = {"knob": 3}       # constructor options, as with --policy-opt

Example counts follow the active Hypothesis profile (half its ``max_examples``, its
``stateful_step_count``), so a project's ``ci``/``nightly`` profiles apply here too.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from hypothesis import settings

from kvsched.testing.checks import FAIL, NOT_CLAIMED, check_machine, check_starvation
from kvsched.testing.claims import declared_claims
from kvsched.testing.resolve import resolve_policy


def format_failures(results) -> str:
    """The failed rows as text: invariant, message, and Hypothesis's shrunk counter-example."""
    parts = []
    for r in results:
        if r.status == FAIL:
            parts.append(f"{r.invariant}: {r.detail}" + (f"\n{r.counterexample}" if r.counterexample else ""))
    return "\n\n".join(parts)


class PolicyConformance:
    """Universal invariants for every policy, plus exactly the claims the policy declares."""

    policy: ClassVar[Any] = None
    policy_options: ClassVar[dict[str, Any] | None] = None
    max_examples: ClassVar[int | None] = None
    stateful_steps: ClassVar[int | None] = None
    starvation_examples: ClassVar[int] = 3
    shrink_seconds: ClassVar[float] = 30.0

    def _resolved(self) -> Any:
        if self.policy is None:
            pytest.skip("no policy given: set `policy` on the subclass, or pass --policy NAME")
        return resolve_policy(self.policy)[1] if isinstance(self.policy, str) else self.policy

    def _examples(self) -> tuple[int, int]:
        profile = settings()
        examples = self.max_examples or max(10, profile.max_examples // 2)
        return examples, self.stateful_steps or profile.stateful_step_count

    def test_declared_claims_are_known(self):
        declared_claims(self._resolved())

    def test_invariants_under_random_operation(self):
        """Random arrivals, aborts, steps and tight configs: every universal invariant (and priority-preemption if
        claimed)."""
        examples, steps = self._examples()
        results = check_machine(
            self._resolved(),
            self.policy_options,
            examples,
            steps,
            derandomize=False,
            shrink_seconds=self.shrink_seconds,
        )
        failures = format_failures(results)
        if failures:
            pytest.fail(failures, pytrace=False)

    def test_starvation_free(self):
        """If claimed: a request finishes while more favoured requests keep arriving faster than they are served."""
        policy = self._resolved()
        result = check_starvation(policy, self.policy_options, self.starvation_examples, derandomize=False)
        if result.status == NOT_CLAIMED:
            pytest.skip("the policy does not claim starvation-free")
        if result.status == FAIL:
            pytest.fail(format_failures([result]), pytrace=False)
