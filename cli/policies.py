"""The policy side of the ``engine`` CLI: ``check`` (the conformance suite as a table) and ``compare``.

``register(app)`` adds both commands; ``cli/app.py`` calls it once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvsched.cli.common import NumOpt, ProfileOpt, QuietOpt, RateOpt, flag, given_options

PoliciesOpt = Annotated[
    list[str] | None, typer.Option("--policy", "-p", help="policy to compare (repeatable, at least two)")
]
FoldersArg = Annotated[
    list[Path] | None,
    typer.Argument(
        help="result folders (engine run or engine bench --output) to put side by side, instead of --policy"
    ),
]
CheckPolicyOpt = Annotated[
    str | None, typer.Option("--policy", "-p", help="installed policy name, or file.py:Attr / module:Attr")
]
ExamplesOpt = Annotated[
    int, typer.Option("--examples", min=1, max=100_000, help="Hypothesis examples for the state machine")
]
StepsOpt = Annotated[int, typer.Option("--steps", min=1, max=10_000, help="rules per state-machine example")]
StarvationOpt = Annotated[
    int,
    typer.Option(min=1, max=10_000, help="Hypothesis examples for the starvation check (an overload scenario each)"),
]
BaselineOpt = Annotated[
    str | None,
    typer.Option(
        "--baseline",
        help="the contender every other is compared with, paired (default: vllm-v1 when compared, else the first)",
    ),
]
CompareOutputOpt = Annotated[
    Path | None,
    typer.Option("--output", "-o", help="folder for comparison.csv (the table) and, with --plot, comparison_cdf.png"),
]
ComparePlotOpt = Annotated[
    bool, flag("--plot", help="also write TTFT/TPOT CDFs per policy (comparison_cdf.png) under --output")
]


def check(
    ctx: typer.Context,
    policy: CheckPolicyOpt = None,
    policy_opt: Annotated[list[str] | None, typer.Option("--policy-opt", help="KEY=VALUE (repeatable)")] = None,
    router: Annotated[
        str | None,
        typer.Option(
            "--router",
            help="check a router instead: an installed router's name, or file.py:Class (the router conformance suite)",
        ),
    ] = None,
    router_opt: Annotated[
        list[str] | None, typer.Option("--router-opt", help="with --router: KEY=VALUE (repeatable)")
    ] = None,
    examples: ExamplesOpt = 40,
    steps: StepsOpt = 30,
    starvation_examples: StarvationOpt = 4,
    shrink_seconds: Annotated[
        float, typer.Option(min=0, max=3600, help="time allowed to shrink each counter-example, in seconds")
    ] = 30.0,
    quiet: QuietOpt = False,
) -> None:
    """Run the conformance suite on POLICY (or ROUTER): invariant, result, shrunk counter-example; exit 1 on failure."""
    from kvsched.cli.common import err_console, fail, parse_pairs, policy_options

    try:
        from kvsched.testing.checks import run_checks
    except ImportError as exc:  # hypothesis comes with the testing extra
        fail(f"engine check needs the testing extra (pip install 'kvsched[testing]'): {exc}")
    if (policy is None) == (router is None):
        fail("give --policy NAME (the policy conformance suite) or --router NAME (the router's), one of them")
    given = given_options(ctx)
    if router is not None:
        refused = sorted(given & {"policy_opt", "steps", "starvation_examples", "shrink_seconds"})
        if refused:
            names = ", ".join(option_name(n) for n in refused)
            fail(f"{names}: a policy's checks; a router's take --router-opt and --examples")
        from kvsched.routers.plugins import load_router
        from kvsched.testing.routers import ROUTER_CHECKS, run_router_checks

        load_router(router)  # an unknown name or a file that fails to load: one line, before any fleet runs
        options = parse_pairs(router_opt, "--router-opt") or None
        if not quiet:
            err_console.print(f"checking router [bold]{router}[/] ({examples} fleets a check) ...", highlight=False)
        _verdict(f"router conformance of {router}", run_router_checks(router, options, examples), ROUTER_CHECKS)
        return
    if router_opt:
        fail("--router-opt is the option of a router: give it with --router")
    from kvsched.testing.claims import CLAIMS, declared_claims
    from kvsched.testing.invariants import INVARIANTS
    from kvsched.testing.resolve import resolve_policy

    name, obj = resolve_policy(policy)
    options = policy_options(policy, policy_opt) or None
    if not quiet:
        err_console.print(
            f"checking policy [bold]{name}[/] ({examples} examples × {steps} steps; claims: "
            f"{', '.join(sorted(declared_claims(obj))) or 'none'}) ...",
            highlight=False,
        )
    results = run_checks(obj, options, examples, steps, starvation_examples, shrink_seconds=shrink_seconds)
    _verdict(f"conformance of {name}", results, {**INVARIANTS, **CLAIMS})


def _verdict(title: str, results: list, meanings: dict[str, str]) -> None:
    """The results as a table (each check, its meaning, its result and counter-example), the counter-examples
    unwrapped, and exit status 1 if any failed."""
    from rich.table import Table

    from kvsched.cli.common import console
    from kvsched.testing.checks import FAIL, PASS

    table = Table(title=title, show_lines=True)
    for col in ("invariant", "result", "counter-example"):
        table.add_column(col, overflow="fold")
    styles = {PASS: "green", FAIL: "bold red"}
    for r in results:
        example = (r.detail + ("\n(shrunk counter-example below)" if r.counterexample else "")) if r.detail else ""
        table.add_row(
            f"{r.invariant}\n[dim]{meanings.get(r.invariant, '')}[/]",
            f"[{styles.get(r.status, 'yellow')}]{r.status}[/]",
            example,
        )
    console.print(table)
    failed = [r.invariant for r in results if r.failed]
    for r in results:
        if r.failed and r.counterexample:  # printed unwrapped, so that it can be pasted as a test
            console.print(f"\n[bold]{r.invariant}[/]: {r.detail}", highlight=False, soft_wrap=True)
            console.print(r.counterexample, highlight=False, soft_wrap=True, markup=False)
    if failed:
        console.print(f"[bold red]{len(failed)} failed:[/] {', '.join(failed)}", highlight=False)
        raise typer.Exit(1)


def compare(
    ctx: typer.Context,
    folders: FoldersArg = None,
    policy: PoliciesOpt = None,
    policy_opt: Annotated[
        list[str] | None,
        typer.Option("--policy-opt", help="POLICY.KEY=VALUE (repeatable; or inline: --policy NAME:KEY=VALUE)"),
    ] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", "-s", help="engine config KEY=VALUE (repeatable)")] = None,
    workload: Annotated[
        str | None, typer.Option("--workload", "-w", help="default, synthetic, azure-conv, sharegpt or a .json spec")
    ] = None,
    trace: Annotated[Path | None, typer.Option("--trace", help="trace CSV")] = None,
    seed: Annotated[int, typer.Option(help="first workload seed")] = 0,
    seeds: Annotated[
        int,
        typer.Option(
            "--seeds", min=1, help="run seeds SEED .. SEED+N-1 and show 95% intervals and paired changes over them"
        ),
    ] = 3,
    num_requests: NumOpt = None,
    rate: RateOpt = None,
    profile: ProfileOpt = "llama2-7b-a100",
    baseline: BaselineOpt = None,
    router: Annotated[
        list[str] | None,
        typer.Option(
            "--router",
            help="compare routers instead of policies: a router to run the fleet behind "
            "(repeatable, at least two; NAME or NAME:KEY=VALUE,...)",
        ),
    ] = None,
    replicas: Annotated[
        int, typer.Option("--replicas", min=1, max=4096, help="with --router: replicas in the fleet")
    ] = 4,
    staleness: Annotated[
        float | None,
        typer.Option("--staleness", min=0, help="with --router: seconds the router's view of each replica lags"),
    ] = None,
    output: CompareOutputOpt = None,
    plot: ComparePlotOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Run the same workloads (same seeds) under each --policy (or each --router); print each metric's mean and
    interval, each one's paired change against the baseline, and ranks."""
    from kvsched.cli.common import build_config, check_finite, fail, progress_bar
    from kvsched.experiments.compare import seed_workloads
    from kvsched.workloads import build_workload

    _check_output(output, plot, trace)
    check_finite(staleness=staleness)
    given = given_options(ctx)
    if folders:
        refused = sorted(
            given
            & {
                "policy",
                "policy_opt",
                "set_",
                "workload",
                "trace",
                "seed",
                "seeds",
                "num_requests",
                "rate",
                "profile",
                "router",
                "replicas",
                "staleness",
            }
        )
        if refused:
            fail(f"result folders are compared as they are: drop {', '.join(option_name(n) for n in refused)}")
        return compare_folders(folders, output, plot, baseline)
    if router:
        if policy_opt:
            fail(
                "--policy-opt does not apply with --router: the fleet's replicas run one --policy (its options "
                "inline: --policy NAME:KEY=VALUE)"
            )
        if len(policy or []) > 1:
            fail("with --router the fleet's replicas run one --policy (inline options: --policy NAME:KEY=VALUE)")
    elif given & {"replicas", "staleness"}:
        fail("--replicas and --staleness describe the fleet of a router comparison: give two or more --router")
    contenders, labels = router_contenders(router) if router else policy_contenders(policy or [], policy_opt)
    base = baseline_label(labels, contenders, baseline)
    loads = seed_workloads(
        lambda s: build_workload(workload, trace, num_requests=num_requests, rate=rate, seed=s), seed, seeds
    )
    config = build_config(set_)
    with progress_bar(quiet, "comparing", "runs") as bar:
        task = bar.add_task("compare", total=len(contenders) * len(loads))
        if router:
            from kvsched.experiments.fleet_compare import run_routers

            fleet = fleet_of(policy[0] if policy else "vllm-v1", config, profile, replicas, staleness)
            runs = run_routers(contenders, labels, fleet, loads, on_done=lambda: bar.advance(task))
        else:
            from kvsched.experiments.compare import run_policies

            runs = run_policies(contenders, labels, loads, config, profile, on_done=lambda: bar.advance(task))
    first = runs[0].summaries[0]
    name = first["workload"].get("name") or first["workload"].get("kind", "workload")
    seeded = (
        f"seeds {seed}–{seed + len(loads) - 1}"
        if len(loads) > 1
        else (f"seed {seed}" + (" (the workload does not depend on its seed: one run)" if seeds > 1 else ""))
    )
    several = len(loads) > 1
    fleet_text = f" · {replicas} replicas of {policy[0] if policy else 'vllm-v1'}" if router else ""
    head = f"{name} · {first['num_requests']} requests · {seeded}"
    title = f"{head}{', mean (95% interval)' if several else ''}{fleet_text} · profile {profile}"
    pooled = f"{head}{', pooled' if several else ''}{fleet_text} · profile {profile}"
    show(runs, title, output, plot, pooled, base)


def option_name(name: str) -> str:
    return "--" + name.rstrip("_").replace("_", "-")


def policy_contenders(policy: list[str], policy_opt: list[str] | None, at_least: int = 2) -> tuple[list, list[str]]:
    """The compared policies as ``Contender``s with their options checked, and their column labels."""
    from kvsched.cli.common import fail, parse_pairs, policy_options
    from kvsched.experiments.compare import Contender, split_options
    from kvsched.plugins.discovery import load_policy, policy_name

    contenders = [Contender.parse(p) for p in policy]
    extra = split_options(parse_pairs(policy_opt, "--policy-opt"), sorted({c.spec for c in contenders}))
    checked, labels = [], []
    for c in contenders:
        both = set(c.options) & set(extra.get(c.spec, {}))
        if both:
            fail(f"--policy {c.text}: option {sorted(both)[0]!r} is also given by --policy-opt")
        options = policy_options(c.spec, {**c.options, **extra.get(c.spec, {})}, prefix=f"{c.spec}.")
        checked.append(Contender(c.text, c.spec, options))
        labels.append(checked[-1].label(policy_name(c.spec, load_policy(c.spec))))
    if len(set(labels)) != len(labels):
        fail(
            f"--policy {', '.join(sorted({x for x in labels if labels.count(x) > 1}))} given twice (a policy under "
            "other options is another: NAME:KEY=VALUE)"
        )
    if len(labels) < at_least:
        fail(
            "compare needs at least two different --policy (a policy under other options counts: NAME:KEY=VALUE), or "
            "result folders"
        )
    return checked, labels


def router_contenders(router: list[str]) -> tuple[list, list[str]]:
    """The compared routers as ``Contender``s (each loads, or fails here), and their column labels."""
    from kvsched.cli.common import fail
    from kvsched.experiments.compare import Contender
    from kvsched.routers.plugins import load_router

    contenders = [Contender.parse(r) for r in router]
    for c in contenders:
        load_router(c.spec)
    labels = [c.text for c in contenders]
    if len(labels) < 2 or len(set(labels)) != len(labels):
        fail("a router comparison needs at least two different --router")
    return contenders, labels


def baseline_label(labels: list[str], contenders: list, given: str | None) -> str:
    """The baseline's label: ``--baseline`` names a contender by its label or as given on the command line."""
    from kvsched.experiments.evidence import choose_baseline

    if given is not None:
        for label, c in zip(labels, contenders):
            if given in (label, c.text):
                return label
    return choose_baseline(labels, given)


def fleet_of(policy: str, config, profile: str, replicas: int, staleness: float | None):
    """A router comparison's fleet: ``replicas`` of ``policy`` (inline options allowed), its settings and profile."""
    from kvsched.cli.common import policy_options
    from kvsched.cluster import FleetSpec, ReplicaGroup
    from kvsched.experiments.compare import Contender

    c = Contender.parse(policy)
    group = ReplicaGroup(
        count=replicas,
        policy=c.spec,
        policy_options=policy_options(c.spec, c.options) or {},
        profile=profile,
        settings=config.model_dump(exclude_unset=True),
    )
    return FleetSpec(replicas=[group], **({"staleness_s": staleness} if staleness is not None else {}))


def _check_output(output: Path | None, plot: bool, trace: Path | None) -> None:
    """``--plot`` writes under ``--output``, as ``engine run --plot`` does; the folder must be writable
    and must not overwrite the trace the comparison replays."""
    from kvsched.cli.common import fail
    from kvsched.reporting.destination import COMPARE_FILES, check_apart, check_folder

    if plot and output is None:
        fail("--plot needs --output DIR (comparison.csv and comparison_cdf.png are written there)")
    if output is not None:
        check_folder(output, COMPARE_FILES)
        check_apart({"--output": (output, COMPARE_FILES)}, {"--trace": trace})


def compare_folders(folders: list[Path], output: Path | None, plot: bool, baseline: str | None = None) -> None:
    """``engine compare DIR DIR ...``: finished runs, simulated or measured, side by side (a fleet's by its router)."""
    from kvsched.cli.common import fail
    from kvsched.reporting.files import read_compared

    runs = [read_compared(folder) for folder in folders]
    labels = [r.policy for r in runs]
    if len(set(labels)) != len(labels):
        fail(f"two result folders have the same name: {', '.join(sorted({x for x in labels if labels.count(x) > 1}))}")
    base = (
        baseline
        if baseline in labels
        else next((r.policy for r, f in zip(runs, folders) if baseline in (f.name, str(f))), baseline)
    )
    if base is not None and base not in labels:
        fail(f"--baseline {baseline!r} is not one of the folders: {', '.join(labels)}")
    title = "result folders side by side: " + " · ".join(f"{r.policy}: {r.summaries[0].get('profile')}" for r in runs)
    show(runs, title, output, plot, " vs ".join(r.policy for r in runs), base or labels[0])


def show(runs: list, title: str, output: Path | None, plot: bool, plot_title: str, baseline: str) -> None:
    """The comparison table of ``runs`` (a column each, and each one's change against ``baseline``), the
    statistics note and the runs' warnings; under ``output`` the table as CSV and, with ``plot``, their CDFs."""
    from rich.markup import escape

    from kvsched.cli.common import console
    from kvsched.cli.tables import print_ranked
    from kvsched.experiments.compare import table, warnings_of
    from kvsched.reporting.files import write_comparison

    head, rows = table(runs, baseline)
    print_ranked(title, head, rows, baseline)
    seen: dict[str, list[str]] = {}
    for run in runs:
        for text in warnings_of(runs, run.policy):
            seen.setdefault(text, []).append(run.policy)
    for text, who in seen.items():
        whose = "every contender" if len(who) == len(runs) else ", ".join(who)
        console.print(f"[bold yellow]warning:[/] {escape(text)} ({escape(whose)})", highlight=False, soft_wrap=True)
    if output is not None:
        for path in write_comparison(runs, head, rows, output, plot_title if plot else None):
            console.print(f"wrote {path}", highlight=False)


def register(app: typer.Typer) -> None:
    """Add ``check`` and ``compare`` to the ``engine`` app."""
    from kvsched.cli.common import cli_errors

    app.command()(cli_errors(check))
    app.command()(cli_errors(compare))
