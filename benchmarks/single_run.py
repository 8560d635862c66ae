"""What ``engine run`` runs for one engine, making its records, on any code a benchmark compares: the fleet of one with
no router (``cluster/fleet_of_one.py``), or, on a code from before a single run was that (issue 33), ``Engine.run``
with a ``RequestLog`` taking the finished groups from the engine. Imported from the benchmarks beside it, so an older
code, which has no such module, runs this one."""

from __future__ import annotations

from collections.abc import Callable


def engine_run_loop(engine) -> Callable:
    """A call that replays a list of requests (in arrival order) through ``engine`` as ``engine run`` does, records
    included."""
    from kvsched.metrics.records import RequestLog

    try:
        from kvsched.cluster.fleet_of_one import FleetOfOne
    except ImportError:  # the code's engine run ran Engine.run, its RequestLog an observer taking from the engine
        log = RequestLog(engine)

        def run(requests):
            engine.run(requests, on_step=log)
            return log.close()

        return run
    return lambda requests: FleetOfOne(engine, RequestLog()).run(requests)
