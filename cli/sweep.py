"""``engine sweep``: policies × ``--set KEY=V1,V2`` grid, in parallel, with a progress bar, a table and a plot."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvsched.cli.common import NumOpt, ProfileOpt, QuietOpt, RateOpt, SeedOpt, flag
from kvsched.cli.simulate import (
    ArrivalOpt,
    CvOpt,
    RateScaleOpt,
    SloTpotOpt,
    SloTtftOpt,
    StartOffsetOpt,
    TraceOpt,
    WorkloadOpt,
)
from kvsched.experiments.ray_backend import DEFAULT_CONNECT_TIMEOUT_S as RAY_TIMEOUT_S


def sweep_warnings(rows: list[dict]) -> list[str]:
    """Each distinct warning of the sweep's points once, with the points it applies to."""
    where: dict[str, list[str]] = {}
    for row in rows:
        for warning in filter(None, row["warnings"].split("; ")):
            where.setdefault(warning, []).append(row["label"])
    return [
        f"{'every configuration' if len(labels) == len(rows) > 1 else ', '.join(labels)}: {warning}"
        for warning, labels in where.items()
    ]


def sweep(
    ctx: typer.Context,
    policy: Annotated[list[str], typer.Option("--policy", "-p", help="policy to include (repeatable)")] = (
        "vllm-default",
    ),
    set_: Annotated[
        list[str] | None, typer.Option("--set", "-s", help="KEY=V1,V2,... engine setting to sweep (repeatable)")
    ] = None,
    fixed: Annotated[
        list[str] | None, typer.Option("--fix", help="KEY=VALUE engine setting held fixed (repeatable)")
    ] = None,
    workload: WorkloadOpt = None,
    trace: TraceOpt = None,
    num_requests: NumOpt = None,
    rate: RateOpt = None,
    rate_scale: RateScaleOpt = 1.0,
    start_offset: StartOffsetOpt = 0.0,
    arrival: ArrivalOpt = None,
    cv: CvOpt = 1.0,
    seed: SeedOpt = 0,
    profile: ProfileOpt = "llama2-7b-a100",
    slo_ttft: SloTtftOpt = None,
    slo_tpot: SloTpotOpt = None,
    workers: Annotated[
        int | None, typer.Option("--workers", "-j", min=1, help="parallel processes (default: CPUs)")
    ] = None,
    ray: Annotated[
        bool,
        flag(
            "--ray",
            help="run the points as Ray tasks on a local Ray of --workers CPUs, started and stopped here (the ray "
            "extra)",
        ),
    ] = False,
    ray_address: Annotated[
        str | None,
        typer.Option(
            "--ray-address",
            metavar="ADDRESS",
            help="run the points as Ray tasks on this running Ray cluster (auto, host:port, ray://host:10001); "
            "implies --ray",
        ),
    ] = None,
    ray_timeout: Annotated[
        float,
        typer.Option(
            "--ray-timeout",
            min=0.1,
            max=3600,
            help=("seconds the Ray cluster at --ray-address has to answer before the sweep gives up"),
        ),
    ] = RAY_TIMEOUT_S,
    output: Annotated[
        Path, typer.Option("--output", "-o", help="folder for sweep.csv, sweep.parquet, tradeoff.png")
    ] = Path("sweep-out"),
    quiet: QuietOpt = False,
) -> None:
    """Run every policy × setting combination and compare them in one table and a trade-off plot."""
    from rich.markup import escape
    from rich.table import Table

    from kvsched.cli.common import check_finite, console, input_files, parse_pairs, progress_bar, refuse_unread
    from kvsched.executors.profiles import resolve_profile
    from kvsched.executors.settings import check_names
    from kvsched.experiments.sweep import SweepSpec, grid_points, parse_grid, run_sweep
    from kvsched.plugins.discovery import load_policy
    from kvsched.reporting.destination import SWEEP_FILES, check_apart, check_folder
    from kvsched.reporting.files import write_sweep
    from kvsched.workloads import build_workload

    if ray_address is not None:
        refuse_unread(ctx, {"workers"}, "to a Ray cluster (--ray-address): its CPUs decide how many points run at once")
    else:
        refuse_unread(ctx, {"ray_timeout"}, "without --ray-address: it bounds the wait for a Ray cluster to answer")
    check_folder(output, SWEEP_FILES)
    check_finite(slo_ttft=slo_ttft, slo_tpot=slo_tpot)
    for name in policy:
        load_policy(name)
    resolve_profile(profile)
    grid = parse_grid(set_)
    wl = dict(
        workload=workload,
        trace=trace,
        num_requests=num_requests,
        rate=rate,
        rate_scale=rate_scale,
        start_offset=start_offset,
        arrival=arrival,
        cv=cv,
        seed=seed,
    )
    built = build_workload(**wl)
    built.describe()  # bad workload options fail here, once, not in every worker
    check_apart({"--output": (output, SWEEP_FILES)}, input_files(workload, trace, profile, policy, built))
    base = parse_pairs(fixed, "--fix")
    check_names(base, "--fix")
    both = sorted(set(base) & set(grid))
    if both:
        raise ValueError(f"{', '.join(both)}: both swept (--set) and fixed (--fix); give each setting once")
    spec = SweepSpec(wl, base, profile, slo_ttft, slo_tpot)
    points = grid_points(list(dict.fromkeys(policy)), grid)
    with progress_bar(quiet, "sweeping", "configurations") as bar:
        task = bar.add_task("sweep", total=len(points))
        rows = run_sweep(
            spec,
            points,
            workers,
            on_done=lambda _row: bar.advance(task),
            ray_address=ray_address or ("local" if ray else None),
            ray_timeout=ray_timeout,
        )
    table = Table(title=f"sweep · {len(points)} configurations · profile {profile}")
    cols = [("policy", "policy")] + [(k, k) for k in grid]
    cols += [
        ("requests_per_s", "req/s"),
        ("output_tokens_per_s", "tok/s"),
        ("ttft_p50_s", "TTFT p50 s"),
        ("ttft_p99_s", "TTFT p99 s"),
        ("tpot_mean_s", "TPOT ms"),
        ("preempt_recompute", "recomp"),
        ("preempt_swap", "swap"),
        ("ignored", "ignored"),
    ]
    if slo_ttft is not None or slo_tpot is not None:
        cols.append(("goodput_req_per_s", "goodput req/s"))
    for key, head in cols:
        table.add_column(head, justify="left" if key == "policy" else "right", no_wrap=key == "policy")
    for r in rows:
        cells = []
        for key, _ in cols:
            v = r[key]
            v = v * 1000 if key == "tpot_mean_s" and v is not None else v
            cells.append(f"{v:.3g}" if isinstance(v, float) else str(v))
        table.add_row(*cells)
    console.print(table)
    for line in sweep_warnings(rows):
        console.print(f"[bold yellow]warning:[/] {escape(line)}", highlight=False, soft_wrap=True)
    for path in write_sweep(rows, output):
        console.print(f"wrote {path}", highlight=False)
