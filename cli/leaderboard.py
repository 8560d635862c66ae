"""``engine leaderboard``: policies × workloads × seeds in simulation (and a served engine with ``--real``),
ranked, written as leaderboard.json, leaderboard.md and leaderboard.html."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from kvsched.cli.bench import DEFAULT_TIMEOUT_S, ApiKeyOpt, LabelOpt, TimeoutOpt, check_label, reach, warn
from kvsched.cli.common import ProfileOpt, QuietOpt, RateOpt, SetOpt
from kvsched.cli.policies import BaselineOpt
from kvsched.experiments.leaderboard import DEFAULT_METRICS, DEFAULT_POLICIES, DEFAULT_REQUESTS, DEFAULT_WORKLOADS

BoardPolicyOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--policy",
        "-p",
        help=f"policy to rank, NAME or NAME:KEY=VALUE,... (repeatable; default: {', '.join(DEFAULT_POLICIES)})",
    ),
]
BoardPolicyOptOpt = Annotated[
    list[str] | None,
    typer.Option("--policy-opt", help="POLICY.KEY=VALUE: an option of a ranked policy (repeatable)"),
]
BoardWorkloadOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--workload",
        "-w",
        help="workload: NAME, NAME@RATE (Poisson, req/s) or NAME@xSCALE (its recorded rate scaled) (repeatable; "
        f"default: {', '.join(DEFAULT_WORKLOADS)})",
    ),
]
MetricOpt = Annotated[
    list[str] | None,
    typer.Option("--metric", help=f"metric column (repeatable; default: {', '.join(DEFAULT_METRICS)})"),
]


def leaderboard(
    ctx: typer.Context,
    policy: BoardPolicyOpt = None,
    policy_opt: BoardPolicyOptOpt = None,
    set_: SetOpt = None,
    baseline: BaselineOpt = None,
    workload: BoardWorkloadOpt = None,
    metric: MetricOpt = None,
    rank_by: Annotated[
        str | None,
        typer.Option("--rank-by", help="the metric that ranks the policies (default: the first --metric)"),
    ] = None,
    seed: Annotated[int, typer.Option(help="first workload seed")] = 0,
    seeds: Annotated[
        int,
        typer.Option(
            "--seeds", min=1, help="seeds SEED .. SEED+N-1 per workload: each cell's 95% interval is over them"
        ),
    ] = 3,
    num_requests: Annotated[
        int | None,
        typer.Option(
            "--num-requests",
            "-n",
            help=f"requests per workload (default: the first {DEFAULT_REQUESTS} of a built-in trace, a spec's own)",
        ),
    ] = None,
    rate: RateOpt = None,
    profile: ProfileOpt = "llama2-7b-a100",
    workers: Annotated[
        int | None, typer.Option("--workers", "-j", min=1, help="parallel processes (default: CPUs)")
    ] = None,
    real: Annotated[
        str | None,
        typer.Option(
            "--real",
            metavar="URL",
            help="also replay each workload once against this served engine (engine bench's client)",
        ),
    ] = None,
    label: LabelOpt = None,
    model: Annotated[
        str | None,
        typer.Option("--model", help="with --real: the model to request (default: the first the server lists)"),
    ] = None,
    api_key: ApiKeyOpt = "EMPTY",
    timeout: TimeoutOpt = DEFAULT_TIMEOUT_S,
    output: Annotated[
        Path, typer.Option("--output", "-o", help="folder for leaderboard.json, leaderboard.md, leaderboard.html")
    ] = Path("leaderboard"),
    quiet: QuietOpt = False,
) -> None:
    """Rank policies on workloads: every policy × workload × seed simulated, each metric's mean and 95% interval, each
    policy's paired change against the baseline, rank ranges."""
    from kvsched.cli.common import (
        build_config,
        check_finite,
        console,
        err_console,
        fail,
        input_files,
        progress_bar,
        refuse_unread,
    )
    from kvsched.cli.policies import baseline_label, policy_contenders
    from kvsched.experiments.evidence import check_metrics
    from kvsched.experiments.leaderboard import Board, BoardWorkload, board_json, command_line, measure, plan, run_board
    from kvsched.reporting.destination import check_apart, check_folder
    from kvsched.reporting.leaderboard import BOARD_FILES, markdown, write_board

    check_folder(output, BOARD_FILES)
    check_finite(rate=rate)
    metrics = check_metrics(list(metric or DEFAULT_METRICS))
    primary = check_metrics([rank_by])[0] if rank_by else metrics[0]
    if primary not in metrics:
        fail(f"--rank-by {rank_by}: rank by one of the board's --metric columns ({', '.join(m.key for m in metrics)})")
    if real is None:
        refuse_unread(ctx, {"label", "model", "api_key", "timeout"}, "without --real URL: it is for the served engine")
    contenders, labels = policy_contenders(list(policy or DEFAULT_POLICIES), policy_opt, at_least=1)
    base = baseline_label(labels, contenders, baseline)
    settings = build_config(set_).model_dump(mode="json", exclude_unset=True)
    loads = [BoardWorkload.parse(w, rate) for w in workload or DEFAULT_WORKLOADS]
    if all("@" in w.text and not w.text.rpartition("@")[2].startswith("x") for w in loads):
        refuse_unread(ctx, {"rate"}, "when every --workload names its own rate (NAME@RATE)")
    specs = {"--workload" + (f" #{i + 1}" if i else ""): input_files(w.name)["--workload"] for i, w in enumerate(loads)}
    check_apart(
        {"--output": (output, BOARD_FILES)},
        {**input_files(profile=profile, policies=[c.spec for c in contenders]), **specs},
    )
    seed_lists, described = plan(contenders, loads, num_requests, seed, seeds, profile)
    if real is not None:  # before the simulations: a server that is not there fails in a second, not after them
        check_label(label)
        model = reach(real, api_key, model, timeout).model
    board = Board(
        contenders,
        labels,
        loads,
        metrics,
        primary,
        base,
        seed_lists,
        described,
        {k: str(v) for k, v in settings.items()},
    )
    start = time.perf_counter()
    with progress_bar(quiet, "ranking", "runs") as bar:
        task = bar.add_task("board", total=len(labels) * sum(map(len, seed_lists.values())))
        run_board(board, num_requests, profile, workers, on_done=lambda _row: bar.advance(task))
    if real is not None:
        with progress_bar(quiet, "measuring", "requests") as bar:
            task = bar.add_task("real", total=None)
            measure(
                board,
                real,
                num_requests,
                label,
                model,
                api_key,
                on_done=lambda _sent: bar.advance(task),
                timeout=timeout,
                warn=warn,
            )
    doc = board_json(board, command_line(), profile, num_requests)
    console.print(markdown(doc), markup=False, highlight=False, soft_wrap=True)
    for path in write_board(doc, output):
        console.print(f"wrote {path}", highlight=False)
    if not quiet:
        err_console.print(
            f"{sum(map(len, seed_lists.values())) * len(labels)} runs in {time.perf_counter() - start:.1f} s",
            highlight=False,
        )
