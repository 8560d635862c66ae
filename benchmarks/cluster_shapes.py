"""The shapes of issue 24 item 4, reproduced on the cluster simulator (docs/cluster.md), one table each.

    .venv/bin/python benchmarks/cluster_shapes.py sessions     # prefix-affinity vs round-robin on multi-turn sessions
    # prefix-only routing under rising load vs prefix plus load
    .venv/bin/python benchmarks/cluster_shapes.py collapse
    .venv/bin/python benchmarks/cluster_shapes.py staleness    # TTFT p99 at 0, 10, 50, 100 ms of staleness
    .venv/bin/python benchmarks/cluster_shapes.py pd           # P/D at a few prefill:decode ratios vs co-located

Every replica runs ``vllm-default`` on the ``llama2-7b-a100`` profile (the A100's KV cache, a
4,096-token context); each run is deterministic (seeded workloads, seeded routers). ``--quick``
divides the requests by four. Prints Markdown tables (and, with ``--csv DIR``, writes them as CSV).
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

from kvsched.cluster import Cluster, FleetSpec, ReplicaGroup
from kvsched.cluster.summary import fleet_summary
from kvsched.workloads.arrivals import Gamma, Poisson
from kvsched.workloads.distributions import Fixed, LogNormal
from kvsched.workloads.sessions import SessionSpec
from kvsched.workloads.synthetic import SyntheticSpec

CACHING = {"enable_prefix_caching": True}


def run(requests, replicas, router, staleness=0.0, settings=None, router_options=None) -> dict:
    groups = replicas if isinstance(replicas, list) else [ReplicaGroup(count=replicas, settings=settings or {})]
    cluster = Cluster(
        FleetSpec(replicas=groups, router=router, router_options=router_options or {}, staleness_s=staleness)
    )
    start = time.perf_counter()
    cluster.run(requests)
    summary = fleet_summary(cluster)
    summary["wall_s"] = time.perf_counter() - start
    return summary


def row(label: str, s: dict, **more) -> dict:
    busy = [r["busy"] for r in s["replicas"]]
    return {
        "case": label,
        **more,
        "finished": s["finished"],
        "req/s": round(s["requests_per_s"], 2),
        "prefix hits": f"{s['prefix_hit_rate']:.1%}",
        "TTFT mean s": round(s["ttft_s"]["mean"], 3),
        "TTFT p50 s": round(s["ttft_s"]["p50"], 3),
        "TTFT p99 s": round(s["ttft_s"]["p99"], 3),
        "TPOT p50 ms": round(1000 * s["tpot_s"]["p50"], 1),
        "TPOT p99 ms": round(1000 * s["tpot_s"]["p99"], 1),
        "e2e p99 s": round(s["e2e_s"]["p99"], 2),
        "busy min–max": f"{min(busy):.0%}–{max(busy):.0%}",
    }


def sessions(scale: float) -> list[dict]:
    """8 replicas with prefix caching; 300 multi-turn sessions (2–8 turns, 5 s apart on average), 32 system prompts
    among them."""
    workload = SessionSpec(num_sessions=int(300 * scale), rate=4.0, system_prompts=32, seed=0).requests()
    return [
        row(router, run(workload, 8, router, settings=CACHING), requests=len(workload))
        for router in (
            "round-robin",
            "least-outstanding",
            "prefix-affinity",
            "precise-prefix",
            "cache-aware",
            "weighted",
        )
    ]


def collapse(scale: float) -> list[dict]:
    """8 replicas with prefix caching; 600 single-turn requests on 2 long shared prefixes (1,500 tokens)
    plus a short question, at rising rates: prefix-only routing sends each prefix to one replica; each
    guarded router (docs/routers.md) against it and round-robin."""
    rows = []
    for rate in (4.0, 12.0, 24.0):
        workload = SessionSpec(
            num_sessions=int(600 * scale),
            rate=rate,
            turns=Fixed(value=1),
            system_prompts=2,
            system_len=1500,
            user=LogNormal(median=60, sigma=0.5, max=400),
            output=LogNormal(median=120, sigma=0.6, max=400),
            seed=0,
        ).requests()
        unguarded = {"imbalanced_threshold": 1e9}
        for label, router, options in (
            ("prefix only (prefix-affinity, no guard)", "prefix-affinity", unguarded),
            ("prefix-affinity (Ray's guard)", "prefix-affinity", None),
            ("cache-aware (SGLang's guard)", "cache-aware", None),
            ("precise-prefix (Dynamo's cost)", "precise-prefix", None),
            ("weighted (llm-d 2:1:1, least-queue)", "weighted", None),
            ("round-robin", "round-robin", None),
        ):
            rows.append(row(label, run(workload, 8, router, settings=CACHING, router_options=options), rate=rate))
    return rows


def staleness(scale: float) -> list[dict]:
    """16 replicas, 3,000 requests in bursty arrivals (gamma, CV 4) near saturation; routing on reported load only
    (weighted queue-depth:1, kv-utilization:1, no router-local counts)."""
    workload = SyntheticSpec(num_requests=int(3000 * scale), arrivals=Gamma(rate=16 * 5.5, cv=4.0), seed=0).requests()
    return [
        row(
            f"{1000 * s:g} ms",
            run(workload, 16, "weighted", staleness=s, router_options={"weights": "queue-depth:1,kv-utilization:1"}),
        )
        for s in (0.0, 0.01, 0.05, 0.1)
    ]


def pd(scale: float) -> list[dict]:
    """8 replicas in all, co-located or split into prefill:decode pools; 2,000 requests with long prompts, Poisson at
    24/s."""
    workload = SyntheticSpec(
        num_requests=int(2000 * scale),
        arrivals=Poisson(rate=8 * 3.0),
        seed=0,
        prompt=LogNormal(median=1200, sigma=0.5, max=3000),
        output=LogNormal(median=200, sigma=0.6, max=600),
    ).requests()
    rows = [row("co-located 8", run(workload, 8, "least-outstanding"))]
    for p in (2, 4, 6):
        groups = [ReplicaGroup(count=p, role="prefill"), ReplicaGroup(count=8 - p, role="decode")]
        rows.append(row(f"P/D {p}:{8 - p}", run(workload, groups, "least-outstanding")))
    return rows


def table(rows: list[dict]) -> str:
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape", choices=["sessions", "collapse", "staleness", "pd"])
    parser.add_argument("--quick", action="store_true", help="a quarter of the requests")
    parser.add_argument("--csv", type=Path, help="also write the table as DIR/cluster_SHAPE.csv")
    args = parser.parse_args()
    start = time.perf_counter()
    rows = {"sessions": sessions, "collapse": collapse, "staleness": staleness, "pd": pd}[args.shape](
        0.25 if args.quick else 1.0
    )
    print(table(rows))
    print(f"\n({time.perf_counter() - start:.0f} s wall)")
    if args.csv is not None:
        args.csv.mkdir(parents=True, exist_ok=True)
        with open(args.csv / f"cluster_{args.shape}.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
