"""Routers compared: the same fleet and the same seeds' workloads behind each router (``engine compare --router``).

Each router runs every seed's workload on a fresh copy of one fleet; a run's summary is the fleet's
(``cluster/summary.py``: the router named, the prefix-cache hit rate), and the comparison's table is
``engine compare``'s, with the same paired statistics (``experiments/evidence.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa

from kvsched.cluster.spec import FleetSpec
from kvsched.experiments.compare import Contender, PolicyRun


def run_fleet(
    router: Contender, fleet: FleetSpec, workload, slo_ttft: float | None = None, slo_tpot: float | None = None
) -> tuple[dict, pa.Table]:
    """``fleet`` behind ``router`` (its own options over the fleet's) on ``workload``: the fleet's summary (with the SLO
    goodput, given a per-request bound) and its requests' table."""
    from kvsched.cluster.loop import Cluster
    from kvsched.cluster.summary import fleet_summary, fleet_table
    from kvsched.metrics.goodput import goodput_summary

    options = {**fleet.router_options, **router.options}
    cluster = Cluster(fleet.model_copy(update={"router": router.spec, "router_options": options}))
    cluster.run(workload.iter_requests())
    table = fleet_table(cluster)
    description = workload.describe()
    summary = fleet_summary(cluster, table, workload=description, seed=description.get("seed"))
    if slo_ttft is not None or slo_tpot is not None:
        summary["slo"] = goodput_summary(table, summary["duration_s"], slo_ttft, slo_tpot)
    return summary, table


def run_routers(
    routers: list[Contender],
    labels: list[str],
    fleet: FleetSpec,
    workloads: list,
    on_done: Callable[[], None] | None = None,
) -> list[PolicyRun]:
    """Simulate ``fleet`` behind each router on each of ``workloads``."""
    from kvsched.metrics.requests import done_mask, numbers

    runs = []
    for router, label in zip(routers, labels):
        run = PolicyRun(label)
        for workload in workloads:
            summary, table = run_fleet(router, fleet, workload)
            run.summaries.append(summary)
            done = done_mask(table)
            ttft, tpot = numbers(table, "ttft")[done], numbers(table, "tpot")[done]
            run.ttft += ttft[~np.isnan(ttft)].tolist()
            run.tpot += tpot[~np.isnan(tpot)].tolist()
            if on_done is not None:
                on_done()
        runs.append(run)
    return runs
