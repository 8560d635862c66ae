"""Where following the prefix gains, the prefix-aware routers gain (issue 35 item 4): each router against
round-robin on the built-in long-context sessions and on docs/examples/sessions.json, at 8 and 16 replicas,
paired over seeds with ``engine compare``'s statistics (experiments/evidence.py: a paired geometric-mean
ratio and its 95 % interval; * where the interval excludes no change).

    .venv/bin/python benchmarks/router_gain.py                 # the table in docs/cluster.md (14 min here)
    .venv/bin/python benchmarks/router_gain.py --seeds 2 --quick

Each fleet runs ``vllm-v1`` with prefix caching on the ``llama2-7b-a100`` profile. For the long-context
workload each replica gets a 128k context and 29,276 KV blocks, what a model of the same compute with
grouped-query attention (8 KV heads, 128 KiB a token, Llama-3-8B's) leaves of the A100, four times the
profile's own; its sessions are the first 400 of the built-in (the trace's rate, about 800 requests), so
that a run takes seconds on this machine (the full hour is issue 35's speed work).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from kvsched.cluster import FleetSpec, ReplicaGroup
from kvsched.experiments.compare import Contender
from kvsched.experiments.evidence import METRICS, Contest, cell_text, change_text, unit_row
from kvsched.experiments.fleet_compare import run_routers
from kvsched.workloads import build_workload

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_args import bounded  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ROUTERS = ("round-robin", "least-outstanding", "prefix-affinity", "cache-aware", "precise-prefix", "weighted")
PREFIX_AWARE = ROUTERS[2:]
LONG = {"enable_prefix_caching": True, "max_model_len": 131_072, "num_gpu_blocks": 29_276}
CASES = {  # workload name: (spec, sessions, engine settings)
    "long-context": ("long-context", 400, LONG),
    "sessions.json": (str(ROOT / "docs" / "examples" / "sessions.json"), None, {"enable_prefix_caching": True}),
}
TTFT, HITS = METRICS["ttft_mean_s"], METRICS["prefix_hit_rate"]


def contest(workload: str, sessions: int | None, settings: dict, replicas: int, seeds: int) -> Contest:
    """Every router on ``replicas`` replicas, each seed's workload the same for all of them."""
    fleet = FleetSpec(replicas=[ReplicaGroup(count=replicas, policy="vllm-v1", settings=settings)])
    loads = [build_workload(workload, num_requests=sessions, seed=s) for s in range(seeds)]
    runs = run_routers([Contender.parse(r) for r in ROUTERS], list(ROUTERS), fleet, loads)
    return Contest({run.policy: [unit_row(s) for s in run.summaries] for run in runs}, baseline="round-robin")


def rows(name: str, replicas: int, c: Contest) -> list[str]:
    """One Markdown row a router: its mean TTFT and hits, and each one's paired change against round-robin."""
    best = min(PREFIX_AWARE, key=lambda r: c.cell(r, TTFT).mean)
    out = []
    for router in ROUTERS:
        mark = " **(best)**" if router == best else ""
        out.append(
            f"| {name} | {replicas} | {router}{mark} | {cell_text(c.cell(router, HITS), HITS)} | "
            f"{change_text(c.change(router, HITS), HITS) or '–'} | {cell_text(c.cell(router, TTFT), TTFT)} | "
            f"{change_text(c.change(router, TTFT), TTFT) or '–'} |"
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=bounded(int, 2, 50), default=5, help="seeds 0 .. N-1, paired (default 5)")
    parser.add_argument("--quick", action="store_true", help="a quarter of the long-context sessions, 8 replicas only")
    args = parser.parse_args()
    print("| workload | replicas | router | prefix hits % | hits vs round-robin | TTFT mean s | TTFT vs round-robin |")
    print("|---|---|---|---|---|---|---|")
    for name, (workload, sessions, settings) in CASES.items():
        for replicas in (8,) if args.quick else (8, 16):
            start = time.perf_counter()
            size = sessions // 4 if args.quick and sessions else sessions
            for line in rows(name, replicas, contest(workload, size, settings, replicas, args.seeds)):
                print(line, flush=True)
            wall = time.perf_counter() - start
            print(f"{name} at {replicas} replicas: {wall:.0f} s wall", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
