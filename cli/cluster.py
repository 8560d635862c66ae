"""``engine run --replicas N --router NAME`` (and ``--prefill-replicas``/``--decode-replicas``, or
``--fleet spec.json``): a fleet behind a router, simulated; the fleet's summary, a row per replica,
and under ``--output`` the fleet's files (``engine explain DIR --request ID`` says where each went and why)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

ReplicasOpt = Annotated[Optional[int], typer.Option("--replicas", min=1, max=4096, help="simulate a fleet of N replicas (each its own engine) behind --router")]
RouterOpt = Annotated[Optional[str], typer.Option("--router", help="routing policy for the fleet (see `engine routers`; default round-robin), or path/to/file.py:Class")]
RouterOptOpt = Annotated[Optional[list[str]], typer.Option("--router-opt", help="router option KEY=VALUE (repeatable)")]
StalenessOpt = Annotated[Optional[float], typer.Option("--staleness", min=0, help="seconds: the router sees each replica's report at least this old (llm-d: 0.05)")]
PrefillOpt = Annotated[Optional[int], typer.Option("--prefill-replicas", min=1, max=4096, help="P/D disaggregation: replicas in the prefill pool (with --decode-replicas)")]
DecodeOpt = Annotated[Optional[int], typer.Option("--decode-replicas", min=1, max=4096, help="P/D disaggregation: replicas in the decode pool (with --prefill-replicas)")]
FleetOpt = Annotated[Optional[Path], typer.Option("--fleet", help="fleet spec JSON: replica groups (count, role, policy, profile, settings), router, staleness_s, transfer")]
BandwidthOpt = Annotated[Optional[float], typer.Option("--transfer-gbps", min=1e-9, help="P/D: KV transfer bandwidth, GB/s (default 25)")]


def wanted(replicas, prefill, decode, fleet) -> bool:
    """Whether the command line asks for a fleet (then ``engine run`` hands over to ``run_command``)."""
    return any(x is not None for x in (replicas, prefill, decode, fleet))


def fleet_spec(policy, policy_opt, overrides, profile, replicas, router, router_opt, staleness, prefill, decode, fleet, bandwidth):
    """The ``FleetSpec`` the options describe (bad combinations: one line, exit 2)."""
    from kvsched.cli.common import fail, parse_pairs, policy_options
    from kvsched.cluster import FleetSpec, KvTransfer, ReplicaGroup, load_fleet

    router_options = parse_pairs(router_opt, "--router-opt") or None
    transfer = KvTransfer(bandwidth_gb_per_s=bandwidth) if bandwidth is not None else None
    if fleet is not None:
        if replicas is not None or prefill is not None or decode is not None:
            fail("--fleet describes the replicas: drop --replicas, --prefill-replicas and --decode-replicas")
        return load_fleet(fleet, router=router, router_options=router_options, staleness_s=staleness, transfer=transfer)
    if (prefill is None) != (decode is None):
        fail("P/D disaggregation needs both --prefill-replicas and --decode-replicas")
    if prefill is not None and replicas is not None:
        fail("give --replicas (co-located) or --prefill-replicas with --decode-replicas (disaggregated), not both")
    if bandwidth is not None and prefill is None:
        fail("--transfer-gbps is the P/D KV transfer: give it with --prefill-replicas and --decode-replicas")
    settings = {}
    if overrides:
        from kvsched.cli.common import build_config

        settings = build_config(overrides).model_dump(exclude_unset=True)
    common = {"policy": policy, "policy_options": policy_options(policy, policy_opt) or {}, "profile": profile, "settings": settings}
    groups = ([ReplicaGroup(count=replicas, **common)] if replicas is not None else
              [ReplicaGroup(count=prefill, role="prefill", **common), ReplicaGroup(count=decode, role="decode", **common)])
    fields = {"router": router, "router_options": router_options, "staleness_s": staleness, "transfer": transfer}
    return FleetSpec(replicas=groups, **{k: v for k, v in fields.items() if v is not None})


FLEET_FILES = ("summary.json", "requests.csv", "routes.csv")


def run_command(spec, workload, output, quiet, inputs: dict | None = None) -> dict:
    """Simulate the fleet on the workload with a progress bar; print the fleet and its replicas; write the
    files (checked first against ``inputs``, the files the command reads, by option)."""
    from kvsched.cli.common import console, print_summary, progress_bar
    from kvsched.cluster import Cluster
    from kvsched.cluster.summary import fleet_summary, fleet_table

    if output is not None:
        from kvsched.reporting.destination import check_apart, check_folder

        check_folder(output, FLEET_FILES)
        check_apart({"--output": (output, FLEET_FILES)}, inputs or {})
    cluster = Cluster(spec)
    start = time.perf_counter()
    with progress_bar(quiet) as bar:
        task = bar.add_task("run", total=workload.num_requests)
        cluster.run(workload.iter_requests(), on_finished=None if quiet else lambda n: bar.advance(task, n))
    wall = time.perf_counter() - start
    table = fleet_table(cluster)
    summary = fleet_summary(cluster, table, workload=workload.describe(), seed=workload.describe().get("seed"))
    print_summary(summary)
    console.print(replica_table(summary), highlight=False)
    console.print(f"simulated {table.num_rows} requests on {len(cluster.replicas)} replicas in {wall:.2f} s wall "
                  f"({table.num_rows / max(wall, 1e-9):,.0f} req/s); router {cluster.router.name}, staleness {cluster.staleness * 1000:g} ms, "
                  f"prefix-cache hits {summary['prefix_hit_rate']:.1%} of prompt tokens", highlight=False)
    if output is not None:
        for path in write_fleet(cluster, summary, table, output):
            console.print(f"wrote {path}", highlight=False)
    return summary


def replica_table(summary: dict):
    """One row per replica: routed, finished, busy, TTFT and end-to-end p50/p99, prefix hits."""
    from rich.table import Table

    table = Table(title=f"{summary['fleet']['replicas']} replicas · router {summary['fleet']['router']}")
    for col in ("replica", "policy", "routed", "finished", "busy", "TTFT p50 / p99 (s)", "e2e p50 / p99 (s)", "prefix hits"):
        table.add_column(col, justify="left" if col in ("replica", "policy") else "right", no_wrap=col == "replica")
    for row in summary["replicas"]:
        def pair(d):
            return "-" if d["p50"] is None else f"{d['p50']:.3g} / {d['p99']:.3g}"
        table.add_row(row["replica"], row["policy"], str(row["routed"]), str(row["finished"]), f"{row['busy']:.0%}",
                      pair(row["ttft_s"]), pair(row["e2e_s"]), f"{row['prefix_hit_rate']:.1%}")
    return table


def write_fleet(cluster, summary: dict, table, output: Path) -> list[Path]:
    """``summary.json`` (fleet and replicas), ``requests.csv`` (with each request's replicas), ``routes.csv`` (where and why)."""
    import pyarrow.csv as pacsv

    from kvsched.cluster.summary import route_table

    from kvsched.reporting.destination import publishing_folder

    with publishing_folder(output, FLEET_FILES) as stage:  # the folder is replaced whole, as a run's is
        (stage / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        pacsv.write_csv(table, stage / "requests.csv")
        pacsv.write_csv(route_table(cluster), stage / "routes.csv")
    return [output / name for name in FLEET_FILES]


def explain_fleet(run_dir: Path, request: str | None) -> list[str]:
    """``engine explain DIR`` on a fleet's folder: where the router sent each request and why (one
    request with ``--request``; else how the requests spread over the replicas and the commonest reasons)."""
    import pyarrow.csv as pacsv

    from kvsched.cli.common import fail

    routes = pacsv.read_csv(run_dir / "routes.csv").to_pylist()
    if request is not None:
        mine = [r for r in routes if r["request_id"] == request]
        if not mine:
            fail(f"request {request!r} is not in {run_dir / 'routes.csv'}")
        lines = [f"{r['time']:.4f} s  {r['pool']} pool → {r['replica']}: {r['reason'] or '(the router gave no reason)'}" for r in mine]
        return lines + _fleet_outcome(run_dir, request)
    counts: dict[str, int] = {}
    reasons: dict[str, int] = {}
    for r in routes:
        counts[r["replica"]] = counts.get(r["replica"], 0) + 1
        kind = (r["reason"] or "(no reason given)").split(":")[0]
        reasons[kind] = reasons.get(kind, 0) + 1
    lines = [f"{len(routes)} routing decisions over {len(counts)} replicas"]
    lines += [f"  {name}: {n} ({n / len(routes):.1%})" for name, n in sorted(counts.items(), key=lambda kv: -kv[1])]
    lines.append("commonest reasons:")
    lines += [f"  {n:>8}  {kind}" for kind, n in sorted(reasons.items(), key=lambda kv: -kv[1])[:8]]
    return lines


def _fleet_outcome(run_dir: Path, request: str) -> list[str]:
    """How the request ended, from the fleet's requests.csv: where it finished, its latencies, its cache hits."""
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv

    table = pacsv.read_csv(run_dir / "requests.csv")
    rows = table.filter(pc.equal(table["request_id"], request)).to_pylist()
    if not rows:
        return []
    names = [r["replica"] for r in json.loads((run_dir / "summary.json").read_text()).get("replicas", [])]
    row, name = rows[0], lambda i: names[i] if 0 <= i < len(names) else f"replica #{i}"
    where = name(row["replica"]) + ("" if row["prompt_replica"] == row["replica"] else f" (its prompt ran on {name(row['prompt_replica'])})")
    seconds = lambda v: "–" if v is None else f"{v:.4f} s"
    return [f"ended {row['status']} on {where}: queued {seconds(row['queueing_time'])}, TTFT {seconds(row['ttft'])}, "
            f"e2e {seconds(row['e2e'])}; {row['cached_tokens']} of its {row['prompt_tokens']} prompt tokens found in that replica's prefix cache"]

