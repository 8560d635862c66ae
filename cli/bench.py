"""``engine bench``: replay a workload against any OpenAI-compatible server and write a simulation's result files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from kvsched.cli.common import (
    NumOpt,
    OutputOpt,
    QuietOpt,
    SeedOpt,
    console,
    err_console,
    fail,
    progress_bar,
)
from kvsched.cli.simulate import RateScaleOpt, TraceOpt, WorkloadOpt
from kvsched.cli.tables import print_summary
from kvsched.errors import error_text, quote
from kvsched.reporting.destination import check_folder

UrlOpt = Annotated[
    str,
    typer.Option(
        "--url",
        help="the server, as its root (http://127.0.0.1:8000, as vllm bench serve --base-url) or its OpenAI API base "
        "(.../v1)",
    ),
]
BenchModelOpt = Annotated[
    str | None, typer.Option("--model", "-m", help="model name to request (default: the first the server lists)")
]
LabelOpt = Annotated[
    str | None, typer.Option("--label", help="what to call the server's policy in the summary (default: the URL)")
]
ApiKeyOpt = Annotated[str, typer.Option("--api-key", envvar="OPENAI_API_KEY", help="API key, if the server wants one")]
TimeoutOpt = Annotated[
    float,
    typer.Option(
        "--timeout",
        min=0.001,
        max=86_400,
        help=("seconds to wait for the server's next byte (connecting, each read of a stream) before a request fails"),
    ),
]
DEFAULT_TIMEOUT_S = 600.0  # a long prompt queued behind others on a busy server waits minutes for its first token


def bench(
    url: UrlOpt,
    workload: WorkloadOpt = None,
    trace: TraceOpt = None,
    num_requests: NumOpt = None,
    rate_scale: RateScaleOpt = 1.0,
    seed: SeedOpt = 0,
    model: BenchModelOpt = None,
    label: LabelOpt = None,
    output: OutputOpt = None,
    api_key: ApiKeyOpt = "EMPTY",
    timeout: TimeoutOpt = DEFAULT_TIMEOUT_S,
    quiet: QuietOpt = False,
) -> None:
    """Send WORKLOAD's requests at their arrival times to the server at URL (streaming); time them from the client."""
    from kvsched.experiments.bench import measured, misfits, replay
    from kvsched.workloads import build_workload

    check_label(label)
    if output is not None:
        check_folder(output)  # before the replay: a long run must not fail only when it writes
    load = build_workload(workload, trace, num_requests=num_requests, rate_scale=rate_scale, seed=seed)
    requests = load.requests()
    server = reach(url, api_key, model, timeout)
    warn(misfits(requests, server.max_model_len))
    with progress_bar(quiet, "benchmarking") as bar:
        task = bar.add_task("bench", total=len(requests))
        sent = replay(url, server.model, requests, api_key, on_done=lambda _: bar.advance(task), timeout=timeout)
    metrics, summary = measured(url, server.model, load, sent, label)
    print_summary(summary)  # a failed request is aborted, its error the reason its warning gives
    if output is not None:
        from kvsched.experiments.simulation import RunResult
        from kvsched.reporting.files import write_results

        for path in write_results(RunResult(None, metrics, summary), Path(output)):
            console.print(f"wrote {path}", highlight=False)


def check_label(label: str | None) -> None:
    """A label is printed and written as it is: it must be one line of printable text."""
    if label is not None and (not label.strip() or not all(c.isprintable() for c in label)):
        fail(f"--label must be printable text on one line (no control characters or line breaks), got {quote(label)}")


def reach(url: str, api_key: str, model: str | None, timeout: float):
    """The server's model and context (``experiments.bench.served``), or one line saying why it cannot be reached."""
    from kvsched.experiments.bench import served

    try:
        return served(url, api_key, model, timeout=timeout)
    except Exception as exc:  # openai's connection errors carry no useful class for a user
        fail(f"cannot reach an OpenAI-compatible server at {url}: {error_text(exc)}")


def warn(note: str | None) -> None:
    """A warning line on stderr before the replay (whatever --quiet says: it is a result, not progress)."""
    if note:
        err_console.print(f"[bold yellow]warning:[/] {escape(note)}", highlight=False, soft_wrap=True)
