"""The policy side of the ``engine`` CLI: ``check`` (the conformance suite as a table) and ``compare``.

``register(app)`` adds both commands; ``cli/app.py`` calls it once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from kvsched.cli.common import NumOpt, ProfileOpt, QuietOpt, RateOpt, flag

PoliciesOpt = Annotated[Optional[list[str]], typer.Option("--policy", "-p", help="policy to compare (repeatable, at least two)")]
FoldersArg = Annotated[Optional[list[Path]], typer.Argument(help="result folders (engine run or engine bench --output) to put side by side, instead of --policy")]
CheckPolicyOpt = Annotated[str, typer.Option("--policy", "-p", help="installed policy name, or file.py:Attr / module:Attr")]
ExamplesOpt = Annotated[int, typer.Option("--examples", min=1, max=100_000, help="Hypothesis examples for the state machine")]
StepsOpt = Annotated[int, typer.Option("--steps", min=1, max=10_000, help="rules per state-machine example")]
StarvationOpt = Annotated[int, typer.Option(min=1, max=10_000, help="Hypothesis examples for the starvation check (an overload scenario each)")]
CompareOutputOpt = Annotated[Optional[Path], typer.Option("--output", "-o", help="folder for comparison.csv (the table) and, with --plot, comparison_cdf.png")]
ComparePlotOpt = Annotated[bool, flag("--plot", help="also write TTFT/TPOT CDFs per policy (comparison_cdf.png) under --output")]


def check(policy: CheckPolicyOpt, policy_opt: Annotated[Optional[list[str]], typer.Option("--policy-opt", help="KEY=VALUE (repeatable)")] = None,
          examples: ExamplesOpt = 40, steps: StepsOpt = 30, starvation_examples: StarvationOpt = 4,
          shrink_seconds: Annotated[float, typer.Option(min=0, max=3600, help="time allowed to shrink each counter-example, in seconds")] = 30.0,
          quiet: QuietOpt = False) -> None:
    """Run the conformance suite on POLICY: invariant, result, shrunk counter-example. Exit 1 on any failure."""
    from rich.table import Table

    from kvsched.cli.common import console, err_console, fail, policy_options

    try:
        from kvsched.testing.checks import FAIL, PASS, run_checks
    except ImportError as exc:  # hypothesis comes with the testing extra
        fail(f"engine check needs the testing extra (pip install 'kvsched[testing]'): {exc}")
    from kvsched.testing.invariants import INVARIANTS
    from kvsched.testing.claims import CLAIMS, declared_claims
    from kvsched.testing.resolve import resolve_policy

    name, obj = resolve_policy(policy)
    options = policy_options(policy, policy_opt) or None
    if not quiet:
        err_console.print(f"checking policy [bold]{name}[/] ({examples} examples × {steps} steps; claims: "
                          f"{', '.join(sorted(declared_claims(obj))) or 'none'}) ...", highlight=False)
    results = run_checks(obj, options, examples, steps, starvation_examples, shrink_seconds=shrink_seconds)
    table = Table(title=f"conformance of {name}", show_lines=True)
    for col in ("invariant", "result", "counter-example"):
        table.add_column(col, overflow="fold")
    styles = {PASS: "green", FAIL: "bold red"}
    for r in results:
        meaning = INVARIANTS.get(r.invariant) or CLAIMS.get(r.invariant, "")
        example = (r.detail + ("\n(shrunk counter-example below)" if r.counterexample else "")) if r.detail else ""
        table.add_row(f"{r.invariant}\n[dim]{meaning}[/]", f"[{styles.get(r.status, 'yellow')}]{r.status}[/]", example)
    console.print(table)
    failed = [r.invariant for r in results if r.failed]
    for r in results:
        if r.failed and r.counterexample:  # printed unwrapped, so that it can be pasted as a test
            console.print(f"\n[bold]{r.invariant}[/]: {r.detail}", highlight=False, soft_wrap=True)
            console.print(r.counterexample, highlight=False, soft_wrap=True, markup=False)
    if failed:
        console.print(f"[bold red]{len(failed)} failed:[/] {', '.join(failed)}", highlight=False)
        raise typer.Exit(1)


def compare(folders: FoldersArg = None, policy: PoliciesOpt = None, policy_opt: Annotated[Optional[list[str]], typer.Option("--policy-opt", help="POLICY.KEY=VALUE (repeatable)")] = None,
            set_: Annotated[Optional[list[str]], typer.Option("--set", "-s", help="engine config KEY=VALUE (repeatable)")] = None,
            workload: Annotated[Optional[str], typer.Option("--workload", "-w", help="default, synthetic, azure-conv, sharegpt or a .json spec")] = None,
            trace: Annotated[Optional[Path], typer.Option("--trace", help="trace CSV")] = None,
            seed: Annotated[int, typer.Option(help="first workload seed")] = 0,
            seeds: Annotated[int, typer.Option("--seeds", min=1, help="run seeds SEED .. SEED+N-1 and show 95% confidence intervals over them")] = 3,
            num_requests: NumOpt = None,
            rate: RateOpt = None,
            profile: ProfileOpt = "llama2-7b-a100",
            output: CompareOutputOpt = None,
            plot: ComparePlotOpt = False,
            quiet: QuietOpt = False) -> None:
    """Run the same workloads (same seeds) under each --policy; print each metric's mean and 95% confidence interval side by side."""
    from kvsched.cli.common import build_config, fail, parse_pairs, policy_options, progress_bar
    from kvsched.experiments.compare import run_policies, seed_workloads, split_options
    from kvsched.workloads import build_workload

    _check_output(output, plot, trace)
    if folders:
        return compare_folders(folders, output, plot)
    policy = policy or []
    if len(policy) < 2 or len(set(policy)) != len(policy):
        fail("compare needs at least two different --policy names, or result folders")
    options = split_options(parse_pairs(policy_opt, "--policy-opt"), policy)
    for name in policy:
        options[name] = policy_options(name, options.get(name, {}), prefix=f"{name}.")
    loads = seed_workloads(lambda s: build_workload(workload, trace, num_requests=num_requests, rate=rate, seed=s), seed, seeds)
    config = build_config(set_)
    with progress_bar(quiet, "comparing", "runs") as bar:
        task = bar.add_task("compare", total=len(policy) * len(loads))
        runs = run_policies(policy, loads, config, profile, options, on_done=lambda: bar.advance(task))
    first = runs[0].summaries[0]
    name = first["workload"].get("name") or first["workload"].get("kind", "workload")
    seeded = f"seeds {seed}–{seed + len(loads) - 1}" if len(loads) > 1 else (
        f"seed {seed}" + (" (the workload does not depend on its seed: one run)" if seeds > 1 else ""))
    several = len(loads) > 1
    title = f"{name} · {first['num_requests']} requests · {seeded}{', mean ± 95% CI' if several else ''} · profile {profile}"
    pooled = f"{name} · {first['num_requests']} requests · {seeded}{', pooled' if several else ''} · profile {profile}"
    show(runs, title, output, plot, pooled)


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


def compare_folders(folders: list[Path], output: Path | None, plot: bool) -> None:
    """``engine compare DIR DIR ...``: finished runs, simulated or measured, side by side."""
    from kvsched.reporting.files import read_compared

    runs = [read_compared(folder) for folder in folders]
    title = "result folders side by side: " + " · ".join(f"{r.policy}: {r.summaries[0].get('profile')}" for r in runs)
    show(runs, title, output, plot, " vs ".join(r.policy for r in runs))


def show(runs: list, title: str, output: Path | None, plot: bool, plot_title: str) -> None:
    """The comparison table of ``runs`` (one column each), and under ``output`` the table as CSV and, with ``plot``, their CDFs."""
    from rich.table import Table

    from kvsched.cli.common import console
    from kvsched.experiments.compare import table_rows
    from kvsched.reporting.files import write_comparison

    rows = table_rows(runs)
    table = Table(title=title)
    table.add_column("metric")
    for run in runs:
        table.add_column(run.policy, justify="right")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    if output is not None:
        for path in write_comparison(runs, rows, output, plot_title if plot else None):
            console.print(f"wrote {path}", highlight=False)


def register(app: typer.Typer) -> None:
    """Add ``check`` and ``compare`` to the ``engine`` app."""
    from kvsched.cli.common import cli_errors

    app.command()(cli_errors(check))
    app.command()(cli_errors(compare))
