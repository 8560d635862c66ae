"""A single engine's run is the fleet of one: the cluster loop (``cluster/loop.py``) with one replica and no router.

``engine run`` replays a workload through it. Each request goes to the engine as it arrives (no router call, no
report kept for one); the records are a single run's (``metrics/records.py``'s ``RequestLog``), and the run's
observers are told each step and each steady run as ``Engine.run`` tells them. ``Engine.run`` stays the library's
loop for an engine on its own; the two give the same results (tests/test_engine_events.py).
"""

from __future__ import annotations

from collections.abc import Callable

from kvsched.cluster.loop import Cluster
from kvsched.cluster.replica import MIXED, replica_class
from kvsched.core.engine import Engine
from kvsched.metrics.records import RequestLog


class FleetOfOne(Cluster):
    """``engine`` as a fleet of one with no router: its records kept by ``records`` and each step told to ``on_step``
    (steady runs whole to its ``on_steps``); ``run(requests)`` returns the records, closed."""

    def __init__(self, engine: Engine, records: RequestLog, on_step: Callable | None = None) -> None:
        replica = replica_class(engine)("engine", MIXED, engine, engine.executor.profile.name, 0.0)
        replica.alone(on_step)
        # What the loop reads of a fleet (no spec to build one from): one replica, no router, nothing routed ahead.
        self.spec, self.router, self.records = None, None, records
        self.replicas = self.prefill_pool = [replica]
        self.decode_pool = []
        self.staleness, self.disaggregated, self.ahead, self.now = 0.0, False, 0.0, 0.0
