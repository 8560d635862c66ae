"""Executors run a scheduled step: the simulator here, real models in ``kvsched.core.executors.hf``."""

from kvsched.core.executors.base import Executor, StepResult

__all__ = ["Executor", "StepResult"]
