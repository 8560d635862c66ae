"""The results folder: summary.json, requests.csv, requests.parquet, timeseries.parquet, decisions.parquet
(the decision log, written during the run and moved in with the rest), and with ``--plot`` the
plots, report.html and trace.json; a fleet's summary.json, requests.csv (a run's columns, then each request's
replicas), routes.csv and report.html; all of it published atomically (``reporting/destination.py``). Every CSV
is written one way (``write_csv``), a run's and a fleet's requests.csv by one writer (``write_requests``)."""

from __future__ import annotations

import csv
import json
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvsched.errors import quote
from kvsched.metrics.records import RequestTable, batch_rows, record_rows
from kvsched.metrics.requests import RequestMetrics
from kvsched.reporting.destination import COMPARE_FILES, FLEET_FILES, SWEEP_FILES, publishing_file, publishing_folder

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

    from kvsched.experiments.compare import PolicyRun
    from kvsched.experiments.simulation import RunResult, SimOutcome


def write_results(result: RunResult, directory: Path) -> list[Path]:
    """``summary.json`` and ``requests.csv`` under ``directory`` (created if needed), atomically."""
    with publishing_folder(directory) as stage:
        written = _summary_and_requests(result, stage)
    return [Path(directory) / p.name for p in written]


def write_fleet(summary: dict, requests: pa.Table, routes: pa.Table, output: Path, plot: bool = False) -> list[Path]:
    """A fleet's folder, atomically: ``summary.json`` (the fleet and its replicas), ``requests.csv`` (a single run's
    columns, then the fleet's own: ``cluster/summary.py``'s ``fleet_table``), ``routes.csv`` (where each request
    went and why), and with ``plot`` ``report.html`` (load, prefix hits and latency per replica:
    ``reporting/fleet.py``)."""
    names = FLEET_FILES if plot else FLEET_FILES[:-1]
    with publishing_folder(output, FLEET_FILES) as stage:  # the folder is replaced whole, as a run's is
        write_summary(summary, stage / "summary.json")
        write_requests(requests, stage / "requests.csv")
        write_csv(stage / "routes.csv", routes.column_names, batch_rows(routes.to_batches()))
        if plot:
            from kvsched.reporting.fleet import write_fleet_report

            write_fleet_report(stage, stage / "report.html")
    return [Path(output) / name for name in names]


def write_summary(summary: dict, path: Path) -> Path:
    """``summary.json``, a run's or a fleet's (what a JSON number cannot hold is refused; other values as text)."""
    path.write_text(json.dumps(summary, indent=2, default=str, allow_nan=False) + "\n")
    return path


def write_requests(records: list[RequestMetrics] | RequestTable | pa.Table, path: Path) -> Path:
    """``requests.csv``, a single run's or a fleet's, one row per request in the order the requests arrived: a run's
    columns (``metrics/requests.py``'s ``FIELDS``), then a fleet's own (``cluster/records.py``'s ``EXTRA``); with no
    request, the header ``request_id`` alone. Written row by row: a run's records may be a streamed RequestTable."""
    columns, rows = record_rows(records)
    return write_csv(path, columns if len(records) else ["request_id"], rows)


def write_csv(path: Path, columns: Sequence[str], rows: Iterable[Sequence]) -> Path:
    """Every CSV a run writes, one way: Python's ``csv`` (quoted only where a cell needs it), UTF-8, a number as
    Python writes it (``repr``: ``0.0``, ``1e-05``), a missing value (None) as an empty cell."""
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows(rows)
    return path


def _summary_and_requests(result: RunResult, directory: Path) -> list[Path]:
    return [
        write_summary(result.summary, directory / "summary.json"),
        write_requests(result.requests, directory / "requests.csv"),
    ]


def requests_frame(metrics: list[RequestMetrics]) -> pd.DataFrame:
    import pandas as pd

    columns = [f.name for f in fields(RequestMetrics)]
    frame = pd.DataFrame([m.as_dict() for m in metrics], columns=columns)
    for col in ("first_scheduled_time", "first_token_time", "finish_time", "queueing_time", "ttft", "tpot", "e2e"):
        frame[col] = frame[col].astype("float64")  # None -> NaN, so an all-missing column keeps its type
    return frame


def write_outputs(outcome: SimOutcome, directory: Path, plot: bool = False, trace: Path | None = None) -> list[Path]:
    """Write every result file of ``outcome`` under ``directory``, atomically (the result files of
    an earlier run there are replaced, not left beside these); returns the paths written.

    With ``plot``: the PNG plots, ``report.html`` and ``trace.json``; with ``trace``, the trace
    (also) at that path. Both are made from the files, decision log included."""
    with publishing_folder(directory) as stage:
        written = [Path(directory) / p.name for p in _outputs(outcome, stage, plot)]
    if trace is not None:
        from kvsched.reporting.trace import write_trace

        with publishing_file(trace) as temp:
            write_trace(read_run(directory), temp)
        written.append(Path(trace))
    return written


def _outputs(outcome: SimOutcome, directory: Path, plot: bool) -> list[Path]:
    written = _summary_and_requests(outcome.result, directory)
    # Records and time series streamed during the run (a RequestTable, a recorder with a file) were
    # written beside the stage, row group by row group, like the decision log: they join the rest.
    path = directory / "requests.parquet"
    records = outcome.result.requests
    streamed = isinstance(records, RequestTable)
    if streamed:
        shutil.move(records.path, path)
    else:
        requests_frame(records).to_parquet(path, index=False)
    written.append(path)
    series = outcome.timeseries
    if series is not None:
        path = directory / "timeseries.parquet"
        if series.file is not None:
            shutil.move(series.file.path, path)
        else:
            series.frame().to_parquet(path, index=False)
        written.append(path)
    if outcome.decision_log is not None:  # written during the run, beside the stage: it joins the rest
        written.append(Path(shutil.move(outcome.decision_log, directory / "decisions.parquet")))
    if outcome.lifecycle is not None:
        written += write_lifecycle(outcome.lifecycle, directory)
    if plot:
        from kvsched.reporting.html import write_report
        from kvsched.reporting.plots import run_plots
        from kvsched.reporting.trace import write_trace

        if outcome.decision_log is None:
            raise ValueError(
                "the report and the trace are made from the decision log: run the job with decision_log set"
            )
        run = read_run(directory)
        written.append(write_trace(run, directory / "trace.json"))
        written += run_plots(run.requests, run.steps, outcome.summary, directory)
        written.append(write_report(run, directory / "report.html"))
    return written


def write_lifecycle(reports: dict[str, dict], directory: Path) -> list[Path]:
    """inference-perf's report files (``metrics/lifecycle.py``: name to content) into ``directory``."""
    written = []
    for name, report in reports.items():
        path = Path(directory) / name
        path.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
        written.append(path)
    return written


def write_sweep(rows: list[dict[str, Any]], directory: Path) -> list[Path]:
    """A sweep's rows as ``sweep.csv`` and ``sweep.parquet``, and its trade-off plot, atomically."""
    from kvsched.reporting.comparisons import tradeoff_plot

    with publishing_folder(directory, SWEEP_FILES) as stage:
        written = write_sweep_table(rows, stage) + [tradeoff_plot(rows, stage / "tradeoff.png")]
    return [Path(directory) / Path(p).name for p in written]


def write_comparison(
    runs: list[PolicyRun], head: list[str], rows: list[list[str]], directory: Path, plot_title: str | None = None
) -> list[Path]:
    """A comparison's table (``head`` and ``rows``, as printed) as ``comparison.csv`` and, given ``plot_title``,
    the runs' CDFs as ``comparison_cdf.png``, atomically."""
    from kvsched.reporting.comparisons import plot_cdfs

    with publishing_folder(directory, COMPARE_FILES) as stage:
        written = [write_csv(stage / "comparison.csv", head, rows)]
        if plot_title is not None:
            written.append(plot_cdfs(runs, stage / "comparison_cdf.png", plot_title))
    return [Path(directory) / p.name for p in written]


def write_sweep_table(rows: list[dict[str, Any]], directory: Path) -> list[Path]:
    """A sweep's rows as ``sweep.csv`` and ``sweep.parquet`` (into an existing folder)."""
    import pandas as pd

    directory = Path(directory)
    frame = pd.DataFrame(rows)
    csv_path, pq_path = directory / "sweep.csv", directory / "sweep.parquet"
    frame.to_csv(csv_path, index=False)
    frame.to_parquet(pq_path, index=False)
    return [csv_path, pq_path]


@dataclass
class RunFiles:
    """A results folder read back: what ``engine explain``, the trace and the report are made of."""

    directory: Path
    summary: dict
    requests: pd.DataFrame
    steps: pd.DataFrame  # timeseries.parquet
    events: pd.DataFrame  # decisions.parquet


# What of summary.json the explanation reads (a folder's summary has more).
RUN_SUMMARY = {
    "policy": str,
    "num_requests": int,
    "duration_s": float,
    "steps": int,
    "workload": (dict, None),
    "config": {"watermark": float, "num_gpu_blocks": int, "num_cpu_blocks": int},
}
_DISTRIBUTION = ({"mean": (float, None), "p50": (float, None), "p99": (float, None)}, None)
# What of summary.json the comparison reads: its rows (experiments.compare.ROWS), null where a run could not know.
COMPARED_SUMMARY = {
    "policy": (str, None),
    "num_requests": int,
    "finished": int,
    "ignored": int,
    "aborted": int,
    "requests_per_s": float,
    "throughput_tokens_per_s": float,
    "ttft_s": _DISTRIBUTION,
    "tpot_s": _DISTRIBUTION,
    "e2e_s": _DISTRIBUTION,
    "preemptions": ({"recompute": int, "swap": int}, None),
}


def read_run(directory: Path) -> RunFiles:
    """Read a folder written by ``engine run --output``; a missing or damaged file is one clear error."""
    from kvsched.metrics import decision_log, records, timeseries
    from kvsched.reporting.reading import read_summary, read_table

    directory = Path(directory)
    names = ("summary.json", "requests.parquet", "timeseries.parquet", "decisions.parquet")
    missing = [n for n in names if not (directory / n).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{directory} has no {', '.join(missing)}: write it with `engine run ... --output {directory}` "
            "(the decision log is on by default)"
        )
    run = RunFiles(
        directory,
        read_summary(directory / "summary.json", RUN_SUMMARY),
        read_table(directory / "requests.parquet", records.SCHEMA),
        read_table(directory / "timeseries.parquet", timeseries.SCHEMA),
        read_table(directory / "decisions.parquet", decision_log.schema()),
    )
    _check_together(run)
    return run


def _check_together(run: RunFiles) -> None:
    """The files of one run: a row per step 0, 1, 2, ... in the time series, decisions of those steps
    and of the requests in the records (what the explanation indexes by)."""
    import numpy as np

    from kvsched.metrics.phases import sampled_ids
    from kvsched.userfiles.reader import FileError

    steps, events, where = run.steps.step.to_numpy(), run.events, run.directory
    if not np.array_equal(steps, np.arange(len(steps))):
        raise FileError(
            "the steps are not 0, 1, 2, ... in order, one row each", where / "timeseries.parquet", column="step"
        )
    outside = events.step[~events.step.between(0, len(steps) - 1)]
    if len(outside):
        raise FileError(
            f"step {outside.tolist()[0]}, but timeseries.parquet has steps 0-{len(steps) - 1}",
            where / "decisions.parquet",
            column="step",
        )
    known = {*run.requests.request_id, *(sid for ids in sampled_ids(events, run.requests).values() for sid in ids)}
    unknown = events.request_id[events.request_id.notna() & ~events.request_id.isin(known)]
    if len(unknown):
        raise FileError(
            f"request {quote(unknown.iloc[0])}, which requests.parquet has no row for",
            where / "decisions.parquet",
            column="request_id",
        )


def read_compared(directory: Path) -> PolicyRun:
    """A results folder (``engine run`` or ``engine bench --output``) as one column of ``engine compare``."""
    from kvsched.experiments.compare import PolicyRun
    from kvsched.reporting.reading import read_numbers, read_summary

    directory = Path(directory)
    summary_path, requests_path = directory / "summary.json", directory / "requests.csv"
    if not summary_path.is_file() or not requests_path.is_file():
        raise FileNotFoundError(f"{directory} has no summary.json and requests.csv: give folders written with --output")
    summary = read_summary(summary_path, COMPARED_SUMMARY)
    latencies = read_numbers(requests_path, ("ttft", "tpot"))
    fleet = summary.get("fleet")
    who = (
        f"router {fleet.get('router')}" if isinstance(fleet, dict) else summary.get("policy")
    )  # a fleet is told by its router
    label = f"{directory.name} ({who})"
    return PolicyRun(label, [summary], latencies["ttft"], latencies["tpot"])
