"""The results folder: summary.json, requests.csv, requests.parquet, timeseries.parquet (and plots)."""

from __future__ import annotations

import csv
import json
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvsched.metrics.records import RequestTable
from kvsched.metrics.requests import FIELDS, RequestMetrics

if TYPE_CHECKING:
    import pandas as pd

    from kvsched.experiments.simulation import RunResult, SimOutcome


def write_results(result: RunResult, directory: Path) -> list[Path]:
    """``summary.json`` and ``requests.csv`` under ``directory`` (created if needed)."""
    directory.mkdir(parents=True, exist_ok=True)
    summary_path = directory / "summary.json"
    summary_path.write_text(json.dumps(result.summary, indent=2, sort_keys=False) + "\n")
    requests_path = directory / "requests.csv"
    with requests_path.open("w", newline="") as f:  # row by row: the records may be a streamed RequestTable
        writer = csv.DictWriter(f, fieldnames=list(FIELDS) if len(result.requests) else ["request_id"])
        writer.writeheader()
        writer.writerows(m.as_dict() for m in result.requests)
    return [summary_path, requests_path]


def requests_frame(metrics: list[RequestMetrics]) -> pd.DataFrame:
    import pandas as pd

    columns = [f.name for f in fields(RequestMetrics)]
    frame = pd.DataFrame([m.as_dict() for m in metrics], columns=columns)
    for col in ("first_scheduled_time", "first_token_time", "finish_time", "queueing_time", "ttft", "tpot", "e2e"):
        frame[col] = frame[col].astype("float64")  # None -> NaN, so an all-missing column keeps its type
    return frame


def write_outputs(outcome: SimOutcome, directory: Path, plot: bool = False) -> list[Path]:
    """Write every result file of ``outcome`` under ``directory``; returns the paths written."""
    directory = Path(directory)
    written = write_results(outcome.result, directory)
    path = directory / "requests.parquet"
    records = outcome.result.requests
    streamed = isinstance(records, RequestTable) and records.path == path  # already written, row group by row group
    if not streamed:
        requests_frame(records).to_parquet(path, index=False)
    written.append(path)
    series = outcome.timeseries
    if series is not None:
        path = directory / "timeseries.parquet"
        if series.file is None or series.file.path != path:
            series.frame().to_parquet(path, index=False)
        written.append(path)
    if plot:
        req = records.frame() if streamed else requests_frame(records)
        ts = series.frame() if series is not None else None
        from kvsched.reporting.html import write_report
        from kvsched.reporting.plots import run_plots

        pngs = run_plots(req, ts, outcome.summary, directory)
        written += pngs
        written.append(write_report(outcome.summary, pngs, directory / "report.html"))
    return written


def write_sweep_table(rows: list[dict[str, Any]], directory: Path) -> list[Path]:
    """A sweep's rows as ``sweep.csv`` and ``sweep.parquet``."""
    import pandas as pd

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame(rows)
    csv_path, pq_path = directory / "sweep.csv", directory / "sweep.parquet"
    frame.to_csv(csv_path, index=False)
    frame.to_parquet(pq_path, index=False)
    return [csv_path, pq_path]
