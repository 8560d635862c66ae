"""Long-context traffic at the speed of short prompts (issue 35 item 1): the built-in long-context sessions
(an hour, about 12,000 requests, mean prompt about 12,000 tokens, prompts as 512-token block hashes) against the
built-in Azure conversation trace (19,366 short prompts), one replica each with the same settings, and fleets on
the long-context hour.

Every replica runs ``vllm-v1`` with prefix caching on the ``llama2-7b-a100`` profile, ``max_model_len`` 131,072
and 29,276 blocks of 16 tokens (``SETTINGS``). Each run is its own process, made one request at a time as the
engine asks (``iter_requests``, finished requests not retained), and prints its wall and CPU seconds and its
peak RSS; the two one-replica runs alternate over ``--rounds`` and the fastest of each counts (neighbours on a
shared machine only ever slow a run down). Prints one JSON line: requests per wall (and CPU) second of each,
their ratio (the target: at least 0.5), the long-context hour's seconds (under 30), and each fleet's peak RSS
(``--fleets``, round-robin by default: under 1 GB).

    .venv/bin/python benchmarks/long_context_speed.py                       # 2 rounds, fleets of 8 and 16
    .venv/bin/python benchmarks/long_context_speed.py -n 2000 --fleets ''   # a quick look at the ratio
    .venv/bin/python benchmarks/long_context_speed.py --rounds 0 --fleets 16 --router precise-prefix
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_args import bounded  # noqa: E402

SETTINGS = {"enable_prefix_caching": True, "max_model_len": 131_072, "num_gpu_blocks": 29_276}
WORKLOADS = ("azure-conv", "long-context")


def one_run(workload: str, replicas: int, limit: int | None, router: str) -> dict:
    """One workload on one replica (an engine) or a fleet, in this process: its cost."""
    from itertools import islice

    from kvsched.core.config import EngineConfig
    from kvsched.core.engine import Engine
    from kvsched.executors.simulated import SimulatedExecutor
    from kvsched.workloads import build_workload

    requests = build_workload(workload).iter_requests()
    if limit is not None:
        requests = islice(requests, limit)
    count = [0]

    def counted():
        for request in requests:
            count[0] += 1
            yield request

    wall, cpu = time.perf_counter(), time.process_time()
    if replicas == 1:
        engine = Engine(EngineConfig(**SETTINGS), "vllm-v1", SimulatedExecutor("llama2-7b-a100"), retain_finished=False)
        engine.run(counted(), in_order=True)
        engines = [engine]
    else:
        from kvsched.cluster import Cluster, FleetSpec, ReplicaGroup

        group = ReplicaGroup(count=replicas, policy="vllm-v1", settings=SETTINGS)
        cluster = Cluster(FleetSpec(replicas=[group], router=router))
        cluster.run(counted())
        engines = [r.engine for r in cluster.replicas]
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {
        "workload": workload,
        "replicas": replicas,
        "requests": count[0],
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "steps": sum(e.num_steps for e in engines),
        "simulated_s": round(max(e.clock.now() for e in engines), 1),
    }


def measured(workload: str, replicas: int, limit: int | None, router: str) -> dict:
    """``one_run`` in a fresh process (its own peak RSS, no heap left over from the last run)."""
    command = [sys.executable, __file__, "--one", workload, "--replicas", str(replicas), "--router", router]
    if limit is not None:
        command += ["-n", str(limit)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{workload} on {replicas} replica(s) failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rounds", type=bounded(int, 0, 100), default=2, help="one-replica runs of each workload, alternating"
    )
    parser.add_argument(
        "-n", "--num-requests", type=bounded(int, 1, 10**7), default=None, help="the first N of each (default: all)"
    )
    parser.add_argument("--fleets", default="8,16", help="replica counts to run the long-context hour on ('' for none)")
    parser.add_argument("--router", default="round-robin")
    parser.add_argument("--one", choices=WORKLOADS, help=argparse.SUPPRESS)
    parser.add_argument("--replicas", type=bounded(int, 1, 1024), default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_run(args.one, args.replicas, args.num_requests, args.router)))
        return
    fleets = [int(n) for n in args.fleets.split(",") if n.strip()]
    runs = {w: [] for w in WORKLOADS}
    for _ in range(args.rounds):
        for workload in WORKLOADS:
            runs[workload].append(measured(workload, 1, args.num_requests, args.router))
            print(json.dumps(runs[workload][-1]), file=sys.stderr, flush=True)
    out: dict = {"rounds": args.rounds, "settings": SETTINGS, "policy": "vllm-v1"}
    if args.rounds:
        best = {w: min(runs[w], key=lambda r: r["wall_s"]) for w in WORKLOADS}
        for w in WORKLOADS:
            r = best[w]
            out[w] = {k: r[k] for k in ("requests", "wall_s", "cpu_s", "peak_rss_mb", "steps", "simulated_s")}
            out[w] |= {
                "requests_per_wall_s": round(r["requests"] / r["wall_s"]),
                "requests_per_cpu_s": round(r["requests"] / r["cpu_s"]),
            }
        short, long = out["azure-conv"], out["long-context"]
        out["ratio_wall"] = round(long["requests_per_wall_s"] / short["requests_per_wall_s"], 3)
        out["ratio_cpu"] = round(long["requests_per_cpu_s"] / short["requests_per_cpu_s"], 3)
    for replicas in fleets:
        run = measured("long-context", replicas, args.num_requests, args.router)
        print(json.dumps(run), file=sys.stderr, flush=True)
        fleet = {k: run[k] for k in ("requests", "wall_s", "cpu_s", "peak_rss_mb", "steps", "simulated_s")}
        out[f"fleet_{replicas}"] = fleet | {"router": args.router}
    out["load"] = round(os.getloadavg()[0], 1)
    out["python"] = sys.version.split()[0]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
