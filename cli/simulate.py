"""The simulation side of the ``engine`` CLI: ``run`` with workloads and outputs, ``sweep``, ``calibrate``.

``cli/app.py`` owns the app and its shared helpers; the command bodies live here so that the
CLI module stays small. ``register(app)`` adds the commands this module defines.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer

from kvsched.cli.common import flag

WorkloadOpt = Annotated[
    str | None,
    typer.Option(
        "--workload",
        "-w",
        help="default, synthetic, long-context, azure-conv, sharegpt, a .json spec or an inference-perf .yaml",
    ),
]
TraceOpt = Annotated[
    Path | None,
    typer.Option(
        "--trace",
        help="trace CSV: Azure (TIMESTAMP,...), plain (arrival_time_s,...) or lengths (num_prefill_tokens,...)",
    ),
]
RateScaleOpt = Annotated[
    float,
    typer.Option("--rate-scale", min=1e-9, max=1e9, help="multiply the arrival rate (trace times are divided by it)"),
]
StartOffsetOpt = Annotated[float, typer.Option("--start-offset", min=0, help="skip this many trace seconds")]
ArrivalOpt = Annotated[str | None, typer.Option("--arrival", help="synthetic arrivals: poisson or gamma")]
CvOpt = Annotated[float, typer.Option("--cv", min=1e-9, help="coefficient of variation of gamma arrival gaps")]
SloTtftOpt = Annotated[float | None, typer.Option("--slo-ttft", min=0, help="TTFT target (s) for SLO goodput")]
SloTpotOpt = Annotated[float | None, typer.Option("--slo-tpot", min=0, help="TPOT target (s) for SLO goodput")]
PlotOpt = Annotated[bool, flag("--plot", help="also write PNG plots, report.html and trace.json under --output")]
DecisionLogOpt = Annotated[
    bool,
    flag(
        "--decision-log/--no-decision-log",
        help="with --output: write decisions.parquet, every scheduling decision and its reason (read by engine "
        "explain)",
    ),
]
HardwareOpt = Annotated[
    str | None,
    typer.Option(
        "--hardware", help="the GPU to derive the cost model for: h100-sxm, h200, a100-80gb, l40s, b200, or a .json"
    ),
]
ModelConfigOpt = Annotated[
    str | None,
    typer.Option(
        "--model-config",
        help="the model's Hugging Face config.json, its folder, or a shipped name such as llama-3.1-8b",
    ),
]
TpOpt = Annotated[int, typer.Option("--tp", min=1, max=1024, help="tensor-parallel GPUs (with --hardware)")]
DtypeOpt = Annotated[str | None, typer.Option("--dtype", help="weights: bf16, fp16 or fp8 (default: config's)")]
GpuMemoryOpt = Annotated[
    float,
    typer.Option(
        "--gpu-memory-utilization", min=1e-6, max=1.0, help="vLLM's share of GPU memory, which sizes the KV cache"
    ),
]
TraceOutOpt = Annotated[
    Path | None,
    typer.Option(
        "--trace-out", help="write a Perfetto / Chrome trace (JSON) here; with --plot it goes beside the results"
    ),
]


def run_command(
    policy,
    policy_opt,
    overrides,
    seed,
    num_requests,
    rate,
    output,
    profile,
    quiet,
    workload=None,
    trace=None,
    rate_scale=1.0,
    start_offset=0.0,
    arrival=None,
    cv=1.0,
    slo_ttft=None,
    slo_tpot=None,
    plot=False,
    decision_log=True,
    trace_out=None,
    gpu=None,
) -> dict:
    """``engine run``: build the workload, simulate with a progress bar, print the table, write the files
    (``gpu``: the ``--hardware``, ``--model-config``, ``--tp``, ``--dtype`` and ``--gpu-memory-utilization``
    options, by name, when a cost model is derived from the model instead of ``--profile``)."""
    import os

    from kvsched.cli.common import build_config, check_finite, console, fail, input_files, policy_options, progress_bar
    from kvsched.cli.tables import print_summary
    from kvsched.executors.profiles import resolve_profile
    from kvsched.experiments.simulation import FinishedCount, SimJob
    from kvsched.workloads import build_workload

    if plot and output is None:
        fail("--plot needs --output DIR (the plots and report.html are written there)")
    if (plot or trace_out is not None) and not decision_log:
        fail("--plot and --trace-out read the decision log: drop --no-decision-log")
    if trace_out is not None and output is None:
        fail("--trace-out needs --output DIR (the trace is built from the decision log written there)")
    check_finite(slo_ttft=slo_ttft, slo_tpot=slo_tpot)
    options = policy_options(policy, policy_opt)
    config = build_config(overrides)
    gpu_files = {}
    if gpu and (gpu["hardware"] is not None or gpu["model_config"] is not None):
        profile, gpu_files = gpu_profile(gpu, config)
    resolve_profile(profile)
    built = build_workload(
        workload,
        trace,
        num_requests=num_requests,
        rate=rate,
        rate_scale=rate_scale,
        start_offset=start_offset,
        arrival=arrival,
        cv=cv,
        seed=seed,
    )
    if output is not None:
        from kvsched.reporting.destination import RUN_FILES, check_apart, check_file, check_folder

        check_folder(output)
        if trace_out is not None:
            check_file(trace_out, "--trace-out")
        check_apart(
            {"--output": (output, RUN_FILES), "--trace-out": (trace_out, None)},
            {**input_files(workload, trace, profile, [policy], built), **gpu_files},
        )
    # The per-request records, the time series and the decision log are written during the run into
    # a scratch folder (memory stays bounded by the requests in flight however long the run), then
    # moved in with the results; without --output they only feed the summary.
    scratch = tempfile.TemporaryDirectory(prefix="kvsched-run-")
    job = SimJob(
        built,
        policy,
        config,
        profile,
        options,
        slo_ttft,
        slo_tpot,
        decision_log=Path(scratch.name) / "decisions.parquet" if output is not None and decision_log else None,
        stream_to=Path(scratch.name),
    )
    try:
        with progress_bar(quiet) as bar:
            task = bar.add_task("run", total=None)
            try:
                outcome = job.run(
                    on_step=None if quiet else FinishedCount(lambda n: bar.advance(task, n)),
                    on_start=lambda n: bar.update(task, total=n),
                )
            except OSError as exc:  # the decision log is written as the run goes: a full disk shows here
                from kvsched.reporting.destination import OutputError

                raise OutputError(
                    f"cannot write results to {output or scratch.name}: {os.strerror(exc.errno) if exc.errno else exc}"
                ) from None
        print_summary(outcome.summary)
        if outcome.lifecycle is not None:
            console.print(lifecycle_table(outcome.lifecycle))
        console.print(
            f"simulated {outcome.num_requests} requests in {outcome.simulate_s:.2f} s wall "
            f"({outcome.num_requests / max(outcome.simulate_s, 1e-9):,.0f} req/s, "
            f"{outcome.summary['duration_s'] / max(outcome.simulate_s, 1e-9):,.0f}× real time)",
            highlight=False,
        )
        if output is not None:
            from kvsched.reporting.files import write_outputs

            for path in write_outputs(outcome, output, plot=plot, trace=trace_out):
                console.print(f"wrote {path}", highlight=False)
    finally:
        scratch.cleanup()
    return outcome.summary


def gpu_profile(gpu: dict, config) -> tuple:
    """The roofline profile the GPU options describe, and the files it read (for ``check_apart``)."""
    from kvsched.cli.common import fail
    from kvsched.executors.profiles import roofline_profile

    if gpu["hardware"] is None or gpu["model_config"] is None:
        fail("--hardware and --model-config go together: the GPU, and the model's config.json")
    built = roofline_profile(
        gpu["hardware"],
        gpu["model_config"],
        gpu["tp"],
        gpu["dtype"],
        gpu_memory_utilization=gpu["gpu_memory_utilization"],
        max_num_batched_tokens=config.max_num_batched_tokens,
    )
    files = {
        "--hardware": Path(gpu["hardware"]) if str(gpu["hardware"]).endswith(".json") else None,
        "--model-config": Path(gpu["model_config"]) if Path(gpu["model_config"]).is_file() else None,
    }
    return built, files


def lifecycle_table(reports: dict):
    """inference-perf's view of the run: per stage, what its client would report."""
    from rich.table import Table

    table = Table(title="as inference-perf reports it (client side: E2E, TTFT, ITL = normalized time per output token)")
    for col in ("stage", "ok / failed", "E2E mean / p90 / p99 s", "TTFT mean / p90 / p99 s", "ITL mean / p90 / p99 ms"):
        table.add_column(col, justify="right")
    for name, report in reports.items():
        ok, latency = report["successes"], report["successes"]["latency"]

        def three(key, scale=1.0):
            d = latency[key]
            return "-" if d is None else " / ".join(f"{d[k] * scale:.4g}" for k in ("mean", "p90", "p99"))

        stage = "all" if name.startswith("summary") else name.split("_")[1]
        table.add_row(
            stage,
            f"{ok['count']} / {report['failures']['count']}",
            three("request_latency"),
            three("time_to_first_token"),
            three("normalized_time_per_output_token", 1000),
        )
    return table


def register(app: typer.Typer) -> None:
    """Add ``sweep``, ``calibrate`` and ``validate`` to the ``engine`` app."""
    from kvsched.cli.calibrate import calibrate
    from kvsched.cli.common import cli_errors
    from kvsched.cli.sweep import sweep
    from kvsched.cli.validate import validate

    app.command()(cli_errors(sweep))
    app.command()(cli_errors(calibrate))
    app.command()(cli_errors(validate))
