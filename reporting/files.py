"""The results folder: summary.json, requests.csv, requests.parquet, timeseries.parquet, decisions.parquet
(written during the run by the decision log), and with ``--plot`` the plots, report.html and trace.json."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvsched.metrics.requests import RequestMetrics

if TYPE_CHECKING:
    import pandas as pd

    from kvsched.experiments.simulation import RunResult, SimOutcome


def write_results(result: RunResult, directory: Path) -> list[Path]:
    """``summary.json`` and ``requests.csv`` under ``directory`` (created if needed)."""
    directory.mkdir(parents=True, exist_ok=True)
    summary_path = directory / "summary.json"
    summary_path.write_text(json.dumps(result.summary, indent=2, sort_keys=False) + "\n")
    requests_path = directory / "requests.csv"
    rows = [m.as_dict() for m in result.requests]
    with requests_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["request_id"])
        writer.writeheader()
        writer.writerows(rows)
    return [summary_path, requests_path]


def requests_frame(metrics: list[RequestMetrics]) -> pd.DataFrame:
    import pandas as pd

    columns = [f.name for f in fields(RequestMetrics)]
    frame = pd.DataFrame([m.as_dict() for m in metrics], columns=columns)
    for col in ("first_scheduled_time", "first_token_time", "finish_time", "queueing_time", "ttft", "tpot", "e2e"):
        frame[col] = frame[col].astype("float64")  # None -> NaN, so an all-missing column keeps its type
    return frame


def write_outputs(outcome: SimOutcome, directory: Path, plot: bool = False, trace: Path | None = None) -> list[Path]:
    """Write every result file of ``outcome`` under ``directory``; returns the paths written.

    With ``plot``: the PNG plots, ``report.html`` and the trace (``trace.json``, or at ``trace``);
    the trace alone with ``trace``. Both are made from the files, decision log included."""
    directory = Path(directory)
    written = write_results(outcome.result, directory)
    req = requests_frame(outcome.result.requests)
    path = directory / "requests.parquet"
    req.to_parquet(path, index=False)
    written.append(path)
    ts = outcome.timeseries.frame() if outcome.timeseries is not None else None
    if ts is not None:
        path = directory / "timeseries.parquet"
        ts.to_parquet(path, index=False)
        written.append(path)
    if outcome.decision_log is not None:
        written.append(outcome.decision_log)
    if plot or trace is not None:
        from kvsched.reporting.trace import write_trace

        if outcome.decision_log is None:
            raise ValueError("the report and the trace are made from the decision log: run the job with decision_log set")

        run = read_run(directory)
        written.append(write_trace(run, trace if trace is not None else directory / "trace.json"))
    if plot:
        from kvsched.reporting.html import write_report
        from kvsched.reporting.plots import run_plots

        written += run_plots(req, ts, outcome.summary, directory)
        written.append(write_report(run, directory / "report.html"))
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


@dataclass
class RunFiles:
    """A results folder read back: what ``engine explain``, the trace and the report are made of."""

    directory: Path
    summary: dict
    requests: pd.DataFrame
    steps: pd.DataFrame  # timeseries.parquet
    events: pd.DataFrame  # decisions.parquet


def read_run(directory: Path) -> RunFiles:
    """Read a folder written by ``engine run --output``; a missing file is one clear error."""
    import pandas as pd

    directory = Path(directory)
    names = ("summary.json", "requests.parquet", "timeseries.parquet", "decisions.parquet")
    missing = [n for n in names if not (directory / n).is_file()]
    if missing:
        raise FileNotFoundError(f"{directory} has no {', '.join(missing)}: write it with `engine run ... --output {directory}` "
                                "(the decision log is on by default)")
    return RunFiles(directory, json.loads((directory / "summary.json").read_text()), pd.read_parquet(directory / "requests.parquet"),
                    pd.read_parquet(directory / "timeseries.parquet"), pd.read_parquet(directory / "decisions.parquet"))
