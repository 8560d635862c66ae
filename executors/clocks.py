"""The executors' clocks: virtual for simulation (advanced by the cost model), wall-clock for real execution.

Each executor hands the engine its clock (``make_clock``); the engine needs only what
``kvsched.core.executor.Clock`` says of one.
"""

from __future__ import annotations

import time


class VirtualClock:
    """Simulated seconds; moved by the engine (``advance``, ``wait_until``) or by a caller that drives time
    (``set``)."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds

    def wait_until(self, t: float) -> None:
        self._now = max(self._now, t)

    def set(self, t: float) -> None:
        """Move to ``t``; time never runs backwards."""
        if not t >= self._now:  # also refuses NaN
            raise ValueError(f"the clock is at {self._now}; it cannot be set to {t}")
        self._now = float(t)


class WallClock:
    """Seconds since the engine started; ``advance`` is a no-op because real work takes real time."""

    def __init__(self) -> None:
        self._start = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self._start

    def advance(self, seconds: float) -> None:
        pass

    def wait_until(self, t: float) -> None:
        delay = t - self.now()
        if delay > 0:
            time.sleep(delay)
