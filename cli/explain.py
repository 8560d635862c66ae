"""``engine explain RUN_DIR [--request ID | --step N]``: why requests waited, from a run's decision log."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvsched.cli.common import flag


def explain(
    run_dir: Annotated[Path, typer.Argument(help="a results folder written by `engine run --output`")],
    request: Annotated[
        str | None,
        typer.Option("--request", "-r", help="one request's timeline: each wait with its reason and steps"),
    ] = None,
    step: Annotated[int | None, typer.Option("--step", help="one step's batch, and who was left out and why")] = None,
    full: Annotated[
        bool, flag("--full", help="with --request: every phase and every line (the default shortens a long timeline)")
    ] = False,
) -> None:
    """Why requests waited: the top reasons weighted by time, one request's timeline, or one step's batch."""
    from kvsched.cli.common import console, fail
    from kvsched.reporting.explain import Explainer

    if request is not None and step is not None:
        fail("give --request or --step, not both")
    if full and request is None:
        fail("--full is a request's whole timeline: give it with --request ID")
    if (run_dir / "routes.csv").is_file():  # a fleet's folder (engine run --replicas): where each request went and why
        from kvsched.reporting.explain_fleet import explain_fleet

        if step is not None:
            fail(
                "--step does not apply to a fleet's folder: it has no steps to explain (give --request ID, or nothing)"
            )
        if full:
            fail("--full does not apply to a fleet's folder: a request's routes are shown whole")
        for line in explain_fleet(run_dir, request):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
        return
    ex = Explainer.load(run_dir)
    lines = ex.request(request, full) if request is not None else ex.step(step) if step is not None else ex.overview()
    for line in lines:
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    from kvsched.cli.common import cli_errors

    app.command()(cli_errors(explain))
