"""The results folder: summary.json and requests.csv (core), plus requests.parquet and timeseries.parquet."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING

from kvsched.core.metrics import RequestMetrics
from kvsched.core.runner import write_results

if TYPE_CHECKING:
    import pandas as pd

    from kvsched.core.simjob import SimOutcome


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
    req = requests_frame(outcome.result.requests)
    path = directory / "requests.parquet"
    req.to_parquet(path, index=False)
    written.append(path)
    ts = outcome.timeseries.frame() if outcome.timeseries is not None else None
    if ts is not None:
        path = directory / "timeseries.parquet"
        ts.to_parquet(path, index=False)
        written.append(path)
    if plot:
        from kvsched.reporting.html import write_report
        from kvsched.reporting.plots import run_plots

        pngs = run_plots(req, ts, outcome.summary, directory)
        written += pngs
        written.append(write_report(outcome.summary, pngs, directory / "report.html"))
    return written
