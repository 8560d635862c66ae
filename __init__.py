"""kvsched: vLLM's scheduler and paged KV-cache block manager, with policies as pluggy plugins.

Everything a policy author or an embedding program needs is importable from here (``docs/api.md``
lists it); the sub-packages are the implementation. Names load on first use, so that ``import
kvsched`` stays light for the pytest plugin and the CLI, which import it at start-up.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import Any

try:
    __version__ = version("kvsched")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"

_HOMES = {
    "kvsched.allocators.alloc_status": ("AllocStatus",),
    "kvsched.executors.clocks": ("VirtualClock", "WallClock"),
    "kvsched.core.config": ("EngineConfig", "PreemptionMode"),
    "kvsched.core.decisions": ("Decision", "Outcome", "Preemption"),
    "kvsched.core.engine": ("Engine",),
    "kvsched.errors": ("AuditError", "KvschedError", "PolicyError", "StallError", "UnknownPolicyError"),
    "kvsched.core.executor": ("Clock", "Executor", "KnownTokens", "StepResult"),
    "kvsched.core.hookspecs": ("hookimpl",),
    "kvsched.core.outputs": ("ScheduledGroup", "SchedulerOutput", "StepFeatures"),
    "kvsched.plugins.discovery": ("PolicyInfo", "available_policies", "load_policy"),
    "kvsched.core.report": ("StepReport",),
    "kvsched.core.request": ("Request", "SamplingParams"),
    "kvsched.core.sequence": ("SequenceStatus",),
    "kvsched.core.step": ("StepBuilder",),
    "kvsched.core.view": ("CacheView", "GroupView", "OutputView", "QueueView"),
    "kvsched.executors.cost_model": ("CostProfile",),
    "kvsched.executors.fast_path": ("KnownDurations",),
    "kvsched.executors.simulated": ("SimulatedExecutor",),
    "kvsched.executors.steady_runs": ("StepRun",),
    "kvsched.policies.continuous": ("ContinuousBatching",),
    "kvsched.policies.vllm_v1": ("VllmV1",),
}
_MODULE_OF = {name: module for module, names in _HOMES.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'kvsched' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next access skips this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
