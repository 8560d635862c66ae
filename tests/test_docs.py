"""The docs stay true: every hook is documented, the policy in writing-a-policy.md works, and the tests the
vLLM release × feature table names exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import req, unit_engine

from kvsched.core import hookspecs

DOCS = Path(__file__).resolve().parents[1] / "docs"
HOOKS = [name for name in dir(hookspecs) if hasattr(getattr(hookspecs, name), "kvsched_spec")]


def test_hook_names_are_found():
    assert sorted(HOOKS) == ["can_allocate", "choose_preemption", "on_step", "select_batch"]


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_is_documented_with_its_signature(hook):
    import inspect

    args = ", ".join(inspect.signature(getattr(hookspecs, hook)).parameters)
    assert f"## {hook}({args})" in (DOCS / "hooks.md").read_text()
    assert getattr(hookspecs, hook).__doc__.strip()


def example_policy(example: str = "shortest-prompt-first", name: str = "ShortestPromptFirst"):
    text = (DOCS / "writing-a-policy.md").read_text()
    code = re.search(rf"<!-- example: {example} -->\n```python\n(.*?)```", text, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "writing-a-policy.md", "exec"), namespace)
    return namespace[name]


def test_the_documented_vllm_v1_subclass_restates_its_claims_and_gives_its_reasons():
    """Building on vllm-v1: the base class is public, claims are not inherited, a victim comes with its reason."""
    from kvsched.testing.claims import declared_claims

    policy = example_policy("building-on-vllm-v1", "OldestFirstVictim")
    assert declared_claims(policy) == {"starvation-free"}
    assert (
        declared_claims(type("Silent", (policy.__mro__[1],), {})) == frozenset()
    )  # a subclass that says nothing claims nothing
    e = unit_engine(policy(), num_gpu_blocks=6, block_size=4)
    victims = []
    e.run(
        [req(f"r{i}", prompt_len=6, output_len=12, arrival=0.01 * i) for i in range(3)],
        on_step=lambda r: victims.extend(d for d in r.output.decisions if d.kind.name == "PREEMPTED"),
    )
    reasons = [d.reason for d in victims]
    assert reasons and all(r.startswith("arrived first") or r == "no other running request" for r in reasons)
    assert e.leaked_blocks == 0


@pytest.mark.parametrize(
    "example",
    [
        ("shortest-prompt-first", "ShortestPromptFirst"),
        ("shortest-prompt-first-skeleton", "ShortestPromptFirstSkeleton"),
    ],
)
def test_documented_policy_serves_shorter_prompts_first(example):
    e = unit_engine(example_policy(*example), max_num_batched_tokens=64, max_num_seqs=8)
    for length in (60, 40, 20, 10):
        e.add_request(req(f"len{length}", prompt_len=length, output_len=3))
    e.run()
    first = {rid: g.first_token_time for rid, g in e._groups.items()}
    assert first["len10"] <= first["len20"] <= first["len40"] <= first["len60"]
    assert first["len10"] < first["len60"] and e.leaked_blocks == 0


def test_documented_policy_ages_a_long_prompt_past_a_stream_of_short_ones():
    policy = example_policy()
    e = unit_engine(policy, max_num_batched_tokens=64, max_num_seqs=8)
    stream = [req(f"short{i}", prompt_len=8, output_len=4, arrival=i * 0.25) for i in range(120)]
    e.run([req("long", prompt_len=40, output_len=2, arrival=0.1), *stream])
    long_start = e._groups["long"].first_scheduled_time
    assert long_start is not None and long_start < 5.0  # the stream goes on until t = 30


@pytest.mark.parametrize("cls", ["StepBuilder", "GroupView", "CacheView", "OutputView"])
def test_hooks_md_names_every_public_member_of_what_a_policy_is_handed(cls):
    from kvsched.core import step, view

    owner = getattr(step if cls == "StepBuilder" else view, cls)
    text = (DOCS / "hooks.md").read_text()
    missing = [n for n in dir(owner) if not n.startswith("_") and not re.search(rf"`{n}\b", text)]
    assert not missing, f"docs/hooks.md does not mention {cls}.{', '.join(missing)}"


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else None]


def test_the_release_feature_table_names_tests_that_exist():
    """docs/vllm-integration.md backs each cell of its release × feature table with a test: each named
    ``tests/FILE.py::FUNCTION`` must be a module-level test function of that file."""
    import ast

    table = _section((DOCS / "vllm-integration.md").read_text(), "Releases × features")
    for release in ("0.30", "0.31", "0.32", "0.33"):
        assert table.count(f"\n| {release} |") == 2, f"release {release} is not a row of both tables"
    named = set(re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", table))
    assert len(named) >= 15, named
    missing = []
    for path, function in sorted(named):
        file = DOCS.parent / path
        tree = ast.parse(file.read_text()) if file.is_file() else ast.Module(body=[])
        if not any(isinstance(node, ast.FunctionDef) and node.name == function for node in tree.body):
            missing.append(f"{path}::{function}")
    assert not missing, f"docs/vllm-integration.md names tests that do not exist: {missing}"
