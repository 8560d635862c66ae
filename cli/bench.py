"""``engine bench``: replay a workload against any OpenAI-compatible server and write a simulation's result files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from kvsched.cli.common import NumOpt, OutputOpt, QuietOpt, SeedOpt, console, fail, print_summary, progress_bar
from kvsched.cli.simulate import RateScaleOpt, TraceOpt, WorkloadOpt
from kvsched.reporting.destination import check_folder

UrlOpt = Annotated[str, typer.Option("--url", help="the server, as its root (http://127.0.0.1:8000, as vllm bench serve --base-url) or its OpenAI API base (.../v1)")]
BenchModelOpt = Annotated[Optional[str], typer.Option("--model", "-m", help="model name to request (default: the first the server lists)")]
LabelOpt = Annotated[Optional[str], typer.Option("--label", help="what to call the server's policy in the summary (default: the URL)")]
ApiKeyOpt = Annotated[str, typer.Option("--api-key", envvar="OPENAI_API_KEY", help="API key, if the server wants one")]


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
    quiet: QuietOpt = False,
) -> None:
    """Send WORKLOAD's requests at their arrival times to the server at URL (streaming); time them from the client."""
    from kvsched.experiments.bench import measured, replay, served_model
    from kvsched.workloads import build_workload

    if output is not None:
        check_folder(output)  # before the replay: a long run must not fail only when it writes
    load = build_workload(workload, trace, num_requests=num_requests, rate_scale=rate_scale, seed=seed)
    requests = load.requests()
    try:
        model = model or served_model(url, api_key)
    except Exception as exc:  # openai's connection errors carry no useful class for a user
        fail(f"cannot reach an OpenAI-compatible server at {url}: {exc}")
    with progress_bar(quiet, "benchmarking") as bar:
        task = bar.add_task("bench", total=len(requests))
        sent = replay(url, model, requests, api_key, on_done=lambda _: bar.advance(task))
    metrics, summary = measured(url, model, load, sent, label)
    print_summary(summary)  # a failed request is aborted, its error the reason its warning gives
    if output is not None:
        from kvsched.experiments.simulation import RunResult
        from kvsched.reporting.files import write_results

        for path in write_results(RunResult(None, metrics, summary), Path(output)):
            console.print(f"wrote {path}", highlight=False)
