"""The engine core: requests and sequences, configs, hooks, scheduler, engine, executors, CLI."""

from kvsched.allocators.alloc_status import AllocStatus
from kvsched.core.config import EngineConfig, PreemptionMode
from kvsched.core.decisions import Outcome, Preemption
from kvsched.core.engine import Engine
from kvsched.core.errors import KvschedError, PolicyError
from kvsched.core.hookspecs import hookimpl
from kvsched.core.request import Request, SamplingParams
from kvsched.core.sequence import SequenceStatus

__all__ = [
    "AllocStatus", "Engine", "EngineConfig", "KvschedError", "Outcome", "PolicyError", "Preemption",
    "PreemptionMode", "Request", "SamplingParams", "SequenceStatus", "hookimpl",
]
