"""How fast the cluster simulator is: a fleet of replica engines behind a router, one core.

The issue 24 target: 64 replicas replaying 1,000,000 requests in under 10 minutes on one core, in
under 2 GB. The workload is the synthetic one (``SyntheticSpec``'s lengths) with Poisson arrivals at
``--rate-per-replica`` × replicas (4 requests/s per replica by default, the load of the
single-engine million in docs/performance.md), made one at a time as they arrive; each replica runs
``vllm-default`` on the A100 profile; the router reads every replica's stale report per request
(``vllm-dp`` with 50 ms staleness by default). Prints one JSON line: wall and CPU seconds, requests
per wall second, simulated steps, peak RSS, and the fleet's summary numbers. ``--progress N`` also
prints a line to stderr each N finished requests (CPU and wall seconds, RSS so far), so that a run
cut short on a shared machine still says how far it got and at what cost. ``--one-engine N`` first
times one replica alone at the per-replica rate for N requests (CPU microseconds a request): on a
shared machine, the fleet's CPU time over it says what the fleet costs beyond its engines' own
steps. ``--pair N`` times the fleet routed ahead (the default for a router that reads only reports)
against the loop that routes each request at its arrival, same requests, twice each, N requests a
run; ``--no-lookahead`` runs the main measurement with the second loop. ``gc_cpu_s`` is the CPU time
of the collector's passes in the main measurement; ``--gc freeze|off`` freezes the heap before it
(as ``Engine.run`` does) or turns the collector off.

    .venv/bin/python benchmarks/cluster_speed.py                          # 64 replicas, 1,000,000 requests
    .venv/bin/python benchmarks/cluster_speed.py --replicas 8 -n 20000    # a quick look
    .venv/bin/python benchmarks/cluster_speed.py --router round-robin --staleness 0
    .venv/bin/python benchmarks/cluster_speed.py -n 4000 --one-engine 10000   # the fleet against one engine, same load
    .venv/bin/python benchmarks/cluster_speed.py -n 0 --pair 20000            # routed ahead against routed at arrival
    .venv/bin/python benchmarks/cluster_speed.py --replicas 4 --num-gpu-blocks 2048 -n 8000   # under KV pressure
    # the collector's share (gc_cpu_s), frozen or off
    .venv/bin/python benchmarks/cluster_speed.py -n 60000 --gc freeze
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_args import bounded  # noqa: E402

COUNT = bounded(int, 0, 10**9)  # requests: none (skip that part) up to a billion


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=bounded(int, 1, 100_000), default=64)
    parser.add_argument(
        "-n", "--num-requests", type=COUNT, default=1_000_000, help="0: only what --pair or --one-engine time"
    )
    parser.add_argument("--rate-per-replica", type=float, default=4.0)
    parser.add_argument("--router", default="vllm-dp")
    parser.add_argument("--staleness", type=float, default=0.05)
    parser.add_argument("--policy", default="vllm-default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--num-gpu-blocks",
        type=bounded(int, 16, 10_000_000),
        default=None,
        help="each replica's (default: the profile's)",
    )
    parser.add_argument(
        "--progress", type=COUNT, default=0, metavar="N", help="a line to stderr each N finished requests"
    )
    parser.add_argument(
        "--one-engine",
        type=COUNT,
        default=0,
        metavar="N",
        help="first time one replica alone on N requests at the per-replica rate",
    )
    parser.add_argument(
        "--pair",
        type=COUNT,
        default=0,
        metavar="N",
        help="first time routed ahead against routed at arrival, N requests each, twice",
    )
    parser.add_argument(
        "--no-lookahead", action="store_true", help="route each request at its arrival (the loop before routing ahead)"
    )
    parser.add_argument(
        "--gc",
        choices=("on", "freeze", "off"),
        default="on",
        help="the collector in the main measurement: as it is, the heap before it frozen, or disabled",
    )
    args = parser.parse_args()

    from kvsched.cluster.summary import fleet_summary

    settings = {} if args.num_gpu_blocks is None else {"num_gpu_blocks": args.num_gpu_blocks}

    def fleet(replicas: int, lookahead: bool = True):
        from kvsched.cluster import Cluster, FleetSpec, ReplicaGroup

        spec = FleetSpec(
            replicas=[ReplicaGroup(count=replicas, policy=args.policy, settings=settings)],
            router=args.router,
            staleness_s=args.staleness,
        )
        return Cluster(spec, lookahead=lookahead)

    def requests(n: int, replicas: int):
        from kvsched.workloads.arrivals import Poisson
        from kvsched.workloads.synthetic import SyntheticSpec

        return SyntheticSpec(
            num_requests=n, arrivals=Poisson(rate=args.rate_per_replica * replicas), seed=args.seed
        ).iter_requests()

    def cpu_us_per_request(n: int, replicas: int, lookahead: bool = True) -> float:
        cluster, cpu = fleet(replicas, lookahead), time.process_time()
        cluster.run(requests(n, replicas))
        return 1e6 * (time.process_time() - cpu) / n

    one_engine_us = round(cpu_us_per_request(args.one_engine, 1)) if args.one_engine else None
    if args.pair:
        pairs = []
        for _ in range(2):
            at_arrival, ahead = (
                cpu_us_per_request(args.pair, args.replicas, False),
                cpu_us_per_request(args.pair, args.replicas, True),
            )
            pairs.append(
                {"at_arrival_us": round(at_arrival), "ahead_us": round(ahead), "ratio": round(ahead / at_arrival, 3)}
            )
        print(
            json.dumps(
                {
                    "pair": pairs,
                    "requests": args.pair,
                    "replicas": args.replicas,
                    "router": args.router,
                    "staleness_s": args.staleness,
                    "load": round(os.getloadavg()[0], 1),
                }
            ),
            flush=True,
        )
    if not args.num_requests:
        if one_engine_us is not None:
            print(json.dumps({"one_engine_cpu_us_per_request": one_engine_us, "load": round(os.getloadavg()[0], 1)}))
        return
    cluster = fleet(args.replicas, lookahead=not args.no_lookahead)
    collecting = _collector_time(args.gc)
    wall, cpu = time.perf_counter(), time.process_time()
    cluster.run(
        requests(args.num_requests, args.replicas), _progress(args.progress, wall, cpu) if args.progress else None
    )
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    summary = fleet_summary(cluster)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        json.dumps(
            {
                "replicas": args.replicas,
                "requests": args.num_requests,
                "router": args.router,
                "staleness_s": args.staleness,
                "wall_s": round(wall, 1),
                "cpu_s": round(cpu, 1),
                "requests_per_wall_s": round(args.num_requests / wall),
                "steps": summary["steps"],
                "peak_rss_mb": round(peak_mb),
                "simulated_s": round(summary["duration_s"], 1),
                "finished": summary["finished"],
                "ttft_p99_s": summary["ttft_s"]["p99"],
                "leaked_blocks": summary["leaked_blocks"],
                "cpu_us_per_request": round(1e6 * cpu / args.num_requests),
                "one_engine_cpu_us_per_request": one_engine_us,
                "gc": args.gc,
                "gc_cpu_s": round(collecting[0], 1),
                "load": round(os.getloadavg()[0], 1),
                "python": sys.version.split()[0],
            }
        )
    )


def _collector_time(mode: str) -> list[float]:
    """Set the collector as ``mode`` says; the CPU seconds its passes take from now on (``[0]``, kept up to date)."""
    spent, began = [0.0], [0.0]

    def timed(phase: str, _info) -> None:
        if phase == "start":
            began[0] = time.process_time()
        else:
            spent[0] += time.process_time() - began[0]

    gc.callbacks.append(timed)
    if mode == "freeze":
        gc.freeze()
    elif mode == "off":
        gc.disable()
    return spent


def _progress(every: int, wall: float, cpu: float):
    """An ``on_finished`` callback printing, each ``every`` finished requests, the cost so far."""
    done, mark = 0, every

    def on_finished(ended: int) -> None:
        nonlocal done, mark
        done += ended
        if done >= mark:
            mark += every
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            print(
                json.dumps(
                    {
                        "finished": done,
                        "cpu_s": round(time.process_time() - cpu, 1),
                        "wall_s": round(time.perf_counter() - wall, 1),
                        "peak_rss_mb": round(rss),
                        "load": round(os.getloadavg()[0], 1),
                    }
                ),
                file=sys.stderr,
                flush=True,
            )

    return on_finished


if __name__ == "__main__":
    main()
