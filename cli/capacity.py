"""``engine capacity``: the highest request rate each policy (or router) carries within an SLO, over seeds, with the
paired statistics of ``engine compare`` (experiments/capacity.py); a table, and under ``--output`` its files."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from kvsched.cli.common import NumOpt, ProfileOpt, QuietOpt, RateOpt, SetOpt, flag
from kvsched.cli.policies import BaselineOpt

SloOpt = Annotated[
    list[str],
    typer.Option(
        "--slo",
        help="the SLO: NAME=SECONDS, comma-separated or repeated (ttft_p99=2,tpot_p99=0.1); "
        "names: ttft_mean, ttft_p50, ttft_p99, tpot_mean, tpot_p99, e2e_p50, e2e_p99",
    ),
]


def capacity(
    ctx: typer.Context,
    slo: SloOpt,
    policy: Annotated[
        list[str] | None,
        typer.Option(
            "--policy",
            "-p",
            help="policy to size, NAME or NAME:KEY=VALUE,... (repeatable; with --router: the fleet's replicas, one)",
        ),
    ] = None,
    policy_opt: Annotated[list[str] | None, typer.Option("--policy-opt", help="POLICY.KEY=VALUE (repeatable)")] = None,
    router: Annotated[
        list[str] | None,
        typer.Option("--router", help="size routers instead, each in front of one fleet (repeatable)"),
    ] = None,
    replicas: Annotated[
        int, typer.Option("--replicas", min=1, max=4096, help="with --router: replicas in the fleet")
    ] = 4,
    staleness: Annotated[
        float | None, typer.Option("--staleness", min=0, help="with --router: seconds the router's view lags")
    ] = None,
    set_: SetOpt = None,
    workload: Annotated[
        str | None,
        typer.Option("--workload", "-w", help="a built-in workload or a .json spec (its rate is what is scaled)"),
    ] = None,
    trace: Annotated[Path | None, typer.Option("--trace", help="trace CSV")] = None,
    num_requests: NumOpt = None,
    rate: RateOpt = None,
    seed: Annotated[int, typer.Option(help="first workload seed")] = 0,
    seeds: Annotated[
        int, typer.Option("--seeds", min=1, max=100, help="search on seeds SEED .. SEED+N-1: the paired units")
    ] = 3,
    tolerance: Annotated[
        float,
        typer.Option(
            "--tolerance",
            min=0.001,
            max=1.0,
            help="stop bisecting when the loads within and past the SLO are this close (relative)",
        ),
    ] = 0.05,
    profile: ProfileOpt = "llama2-7b-a100",
    baseline: BaselineOpt = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="folder for capacity.json, capacity.md (and capacity.png)")
    ] = None,
    plot: Annotated[
        bool, flag("--plot", help="also write capacity.png (SLO goodput against the offered load) under --output")
    ] = False,
    quiet: QuietOpt = False,
) -> None:
    """The highest request rate each policy (or router) sustains within the SLO: bisection over the rate on each seed,
    each one's capacity with its interval, its paired change against the baseline, rank ranges."""
    from kvsched.cli.common import (
        build_config,
        check_finite,
        console,
        err_console,
        fail,
        given_options,
        progress_bar,
    )
    from kvsched.cli.policies import baseline_label, fleet_of, option_name, policy_contenders, router_contenders
    from kvsched.cli.tables import print_ranked
    from kvsched.experiments.capacity import goodput_bounds, parse_slo, run_capacity
    from kvsched.experiments.compare import seed_workloads
    from kvsched.experiments.leaderboard import command_line
    from kvsched.reporting.capacity import CAPACITY_FILES, capacity_doc, capacity_rows, write_capacity
    from kvsched.reporting.destination import check_apart, check_folder
    from kvsched.workloads import build_workload

    check_finite(rate=rate, staleness=staleness)
    if plot and output is None:
        fail("--plot needs --output DIR (capacity.png is written there)")
    if output is not None:
        check_folder(output, CAPACITY_FILES)
        check_apart({"--output": (output, CAPACITY_FILES)}, {"--trace": trace})
    bounds = parse_slo(slo)
    if router:
        if policy_opt:
            fail(
                "--policy-opt does not apply with --router: the fleet's replicas run one --policy (its options "
                "inline: --policy NAME:KEY=VALUE)"
            )
        if len(policy or []) > 1:
            fail("with --router the fleet's replicas run one --policy (inline options: --policy NAME:KEY=VALUE)")
        contenders, labels = router_contenders(router)
    else:
        refused = sorted(given_options(ctx) & {"replicas", "staleness"})
        if refused:
            fail(f"{', '.join(option_name(n) for n in refused)} describe the fleet of routers: give --router")
        if not policy:
            fail("give the policies to size with --policy (or routers with --router)")
        contenders, labels = policy_contenders(policy, policy_opt, at_least=1)
    base = baseline_label(labels, contenders, baseline)
    config = build_config(set_)
    seed_list = list(
        range(
            seed,
            seed
            + len(
                seed_workloads(
                    lambda s: build_workload(workload, trace, num_requests=num_requests, rate=rate, seed=s), seed, seeds
                )
            ),
        )
    )
    ttft, tpot = goodput_bounds(bounds)
    by_label = dict(zip(labels, contenders))
    fleet = fleet_of(policy[0] if policy else "vllm-v1", config, profile, replicas, staleness) if router else None

    def evaluate(label: str, s: int, scale: float):
        from kvsched.experiments.capacity import Load, offered_rate, within

        load = build_workload(workload, trace, num_requests=num_requests, rate=rate, seed=s, rate_scale=scale)
        if fleet is not None:
            from kvsched.experiments.fleet_compare import run_fleet

            summary = run_fleet(by_label[label], fleet, load, ttft, tpot)[0]
        else:
            from kvsched.experiments.simulation import SimJob

            c = by_label[label]
            summary = (
                SimJob(load, c.spec, config, profile, c.options or None, ttft, tpot, record_timeseries=False)
                .run()
                .summary
            )
        return Load(
            scale, offered_rate(load.requests()), within(summary, bounds), summary["slo"]["goodput_requests_per_s"]
        )

    start = time.perf_counter()
    with progress_bar(quiet, "sizing", "runs") as bar:
        task = bar.add_task("capacity", total=None)
        searches, contest = run_capacity(
            labels, seed_list, evaluate, base, tolerance, on_done=lambda: bar.advance(task)
        )
    head, rows = capacity_rows(contest)
    about = {
        "command": command_line(),
        "profile": profile,
        "workload": build_workload(workload, trace, num_requests=num_requests, rate=rate, seed=seed).describe(),
        "fleet": fleet.model_dump(mode="json") if fleet is not None else None,
        "settings": config.model_dump(mode="json", exclude_unset=True),
        "tolerance": tolerance,
    }
    doc = capacity_doc(searches, contest, seed_list, bounds, about)
    slo_text = ", ".join(f"{k.removesuffix('_s')} ≤ {v:g} s" for k, v in bounds.items())
    seeded = (
        f"seeds {seed_list[0]}–{seed_list[-1]}" if len(seed_list) > 1 else f"seed {seed_list[0]} (one run a contender)"
    )
    print_ranked(
        f"capacity within {slo_text} · {seeded} · profile {profile}"
        + (f" · {replicas} replicas of {policy[0] if policy else 'vllm-v1'}" if router else ""),
        head,
        rows,
        base,
    )
    if output is not None:
        for path in write_capacity(doc, contest, output, plot):
            console.print(f"wrote {path}", highlight=False)
    if not quiet:
        runs = sum(len(s.loads) for runs in searches.values() for s in runs)
        err_console.print(f"{runs} runs in {time.perf_counter() - start:.1f} s", highlight=False)
