"""Policies that fail in the ways a worker process cannot send back as they are (for tests/test_sweep.py and
tests/test_sweep_ray.py): each must fail a sweep or a leaderboard with the line a single run gives."""

from __future__ import annotations

from kvsched.core.hookspecs import hookimpl
from kvsched.policies.continuous import ContinuousBatching


class Raises(ContinuousBatching):
    """Raises from select_batch: a PolicyError, which pickle cannot rebuild."""

    name = "worker-raises"

    @hookimpl
    def select_batch(self, step):
        raise RuntimeError("no batch from me")


class ConstructorRaises(ContinuousBatching):
    name = "worker-constructor-raises"

    def __init__(self) -> None:
        raise RuntimeError("no constructing me")


class ExitsZero(ContinuousBatching):
    """Ends its process with status 0 from a hook: in a worker that must not end the command with 0."""

    name = "worker-exits-zero"

    @hookimpl
    def select_batch(self, step):
        raise SystemExit(0)


class HugeInt(ContinuousBatching):
    """Raises with an int str() refuses (5,001 digits)."""

    name = "worker-huge-int"

    @hookimpl
    def select_batch(self, step):
        raise ValueError(10**5000)


class Unpicklable(ContinuousBatching):
    """Raises with a value pickle refuses (a lambda)."""

    name = "worker-unpicklable"

    def __init__(self) -> None:
        super().__init__()
        self.callback = lambda: None

    @hookimpl
    def select_batch(self, step):
        raise RuntimeError(self.callback)


class EndsItsProcess(ContinuousBatching):
    """Ends its process without a word (os._exit): no error to send back at all."""

    name = "worker-ends-its-process"

    @hookimpl
    def select_batch(self, step):
        import os

        os._exit(0)


FAILING = ("Raises", "ConstructorRaises", "ExitsZero", "HugeInt", "Unpicklable")
