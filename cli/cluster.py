"""``engine run --replicas N --router NAME`` (and ``--prefill-replicas``/``--decode-replicas``, or
``--fleet spec.json``): a fleet behind a router, simulated; the fleet's summary, a row per replica,
and under ``--output`` the fleet's files (``engine explain DIR --request ID`` says where each went and why)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

ReplicasOpt = Annotated[
    int | None,
    typer.Option(
        "--replicas", min=1, max=4096, help="simulate a fleet of N replicas (each its own engine) behind --router"
    ),
]
RouterOpt = Annotated[
    str | None,
    typer.Option(
        "--router",
        help="routing policy for the fleet (see `engine routers`; default round-robin), or path/to/file.py:Class",
    ),
]
RouterOptOpt = Annotated[list[str] | None, typer.Option("--router-opt", help="router option KEY=VALUE (repeatable)")]
StalenessOpt = Annotated[
    float | None,
    typer.Option(
        "--staleness",
        min=0,
        max=3600,
        help="seconds: the router sees each replica's report at least this old (llm-d: 0.05)",
    ),
]
PrefillOpt = Annotated[
    int | None,
    typer.Option(
        "--prefill-replicas",
        min=1,
        max=4096,
        help="P/D disaggregation: replicas in the prefill pool (with --decode-replicas)",
    ),
]
DecodeOpt = Annotated[
    int | None,
    typer.Option(
        "--decode-replicas",
        min=1,
        max=4096,
        help="P/D disaggregation: replicas in the decode pool (with --prefill-replicas)",
    ),
]
FleetOpt = Annotated[
    Path | None,
    typer.Option(
        "--fleet",
        help="fleet spec JSON: replica groups (count, role, policy, profile, settings), router, staleness_s, transfer",
    ),
]
BandwidthOpt = Annotated[
    float | None,
    typer.Option("--transfer-gbps", help="P/D: KV transfer bandwidth, GB/s (default 25; at least 1e-6)"),
]


def wanted(replicas, prefill, decode, fleet) -> bool:
    """Whether the command line asks for a fleet (then ``engine run`` hands over to ``run_command``)."""
    return any(x is not None for x in (replicas, prefill, decode, fleet))


def fleet_spec(
    policy, policy_opt, overrides, profile, replicas, router, router_opt, staleness, prefill, decode, fleet, bandwidth
):
    """The ``FleetSpec`` the options describe (bad combinations: one line, exit 2)."""
    from kvsched.cli.common import fail, parse_pairs, policy_options
    from kvsched.cluster import FleetSpec, KvTransfer, ReplicaGroup, load_fleet

    router_options = parse_pairs(router_opt, "--router-opt") or None
    transfer = KvTransfer(bandwidth_gb_per_s=bandwidth) if bandwidth is not None else None
    if fleet is not None:
        if replicas is not None or prefill is not None or decode is not None:
            fail("--fleet describes the replicas: drop --replicas, --prefill-replicas and --decode-replicas")
        spec = load_fleet(fleet, router=router, router_options=router_options, staleness_s=staleness, transfer=transfer)
        if bandwidth is not None and not spec.disaggregated:
            fail(
                f"--transfer-gbps is the P/D KV transfer: the replica groups of {fleet} are co-located "
                "(no prefill and decode pools)"
            )
        return spec
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
    common = {
        "policy": policy,
        "policy_options": policy_options(policy, policy_opt) or {},
        "profile": profile,
        "settings": settings,
    }
    groups = (
        [ReplicaGroup(count=replicas, **common)]
        if replicas is not None
        else [
            ReplicaGroup(count=prefill, role="prefill", **common),
            ReplicaGroup(count=decode, role="decode", **common),
        ]
    )
    fields = {"router": router, "router_options": router_options, "staleness_s": staleness, "transfer": transfer}
    return FleetSpec(replicas=groups, **{k: v for k, v in fields.items() if v is not None})


def spec_files(spec) -> dict[str, Path | None]:
    """The files a fleet spec's replicas and router read (a cost profile's ``.json``, a policy's or the
    router's ``file.py``), by where the spec names them, for ``check_apart``."""

    def source(plugin) -> Path | None:
        target = plugin.split(":", 1)[0] if isinstance(plugin, str) else ""
        return Path(target) if target.endswith(".py") else None

    files: dict[str, Path | None] = {"the fleet's router": source(spec.router)}
    for i, group in enumerate(spec.replicas):
        files[f"the profile of replica group {i}"] = Path(group.profile) if group.profile.endswith(".json") else None
        files[f"the policy of replica group {i}"] = source(group.policy)
    return files


def run_command(spec, workload, output, quiet, inputs: dict | None = None, plot: bool = False) -> dict:
    """Simulate the fleet on the workload with a progress bar; print the fleet and its replicas; write the
    files (checked first against ``inputs``, the files the command reads, by option, and the spec's own), and with
    ``plot`` its report.html."""
    from kvsched.cli.common import console, fail, progress_bar
    from kvsched.cli.tables import print_summary
    from kvsched.cluster import Cluster
    from kvsched.cluster.summary import fleet_summary, fleet_table, route_table
    from kvsched.reporting.destination import FLEET_FILES

    if plot and output is None:
        fail("--plot needs --output DIR (the fleet's report.html is written there)")
    if output is not None:
        from kvsched.reporting.destination import check_apart, check_folder

        check_folder(output, FLEET_FILES)
        check_apart({"--output": (output, FLEET_FILES)}, {**(inputs or {}), **spec_files(spec)})
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
    console.print(
        f"simulated {table.num_rows} requests on {len(cluster.replicas)} replicas in {wall:.2f} s wall "
        f"({table.num_rows / max(wall, 1e-9):,.0f} req/s); router {cluster.router.name}, staleness "
        f"{cluster.staleness * 1000:g} ms, prefix-cache hits {summary['prefix_hit_rate']:.1%} of prompt tokens",
        highlight=False,
    )
    if not any(r.engine.config.enable_prefix_caching for r in cluster.replicas):
        console.print(
            "[bold yellow]warning:[/] prefix caching is off on every replica, so no prompt finds a cached prefix and a "
            "prefix-aware router has nothing to aim for (vLLM V1 serves with it on: --policy vllm-v1, or --set "
            "enable_prefix_caching=true)",
            highlight=False,
            soft_wrap=True,
        )
    if output is not None:
        from kvsched.reporting.files import write_fleet

        for path in write_fleet(summary, table, route_table(cluster), output, plot):
            console.print(f"wrote {path}", highlight=False)
    return summary


def replica_table(summary: dict):
    """One row per replica: routed, finished, busy, TTFT and end-to-end p50/p99, prefix hits."""
    from rich.table import Table

    table = Table(title=f"{summary['fleet']['replicas']} replicas · router {summary['fleet']['router']}")
    for col in (
        "replica",
        "policy",
        "routed",
        "finished",
        "busy",
        "TTFT p50 / p99 (s)",
        "e2e p50 / p99 (s)",
        "prefix hits",
    ):
        table.add_column(col, justify="left" if col in ("replica", "policy") else "right", no_wrap=col == "replica")
    for row in summary["replicas"]:

        def pair(d):
            return "-" if d["p50"] is None else f"{d['p50']:.3g} / {d['p99']:.3g}"

        table.add_row(
            row["replica"],
            row["policy"],
            str(row["routed"]),
            str(row["finished"]),
            f"{row['busy']:.0%}",
            pair(row["ttft_s"]),
            pair(row["e2e_s"]),
            f"{row['prefix_hit_rate']:.1%}",
        )
    return table
