"""Results per class of request: what a tiered, multi-tenant or session-aware policy is judged by.

A run's headline latencies are over every request; a policy that serves one tier first moves each
tier's latency its own way. ``class_summary`` gives, for each SLO class, tenant and priority of the run
(a dimension only where the run has more than one value, or any SLO class at all), the requests, how
many finished, and their TTFT, TPOT and end-to-end distributions; and over the sessions of a
multi-turn workload, the distribution of each session's mean TTFT (a conversation is as slow as its
turns). ``summary.json`` holds it as ``classes``; compare, bench and the report show it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvsched.metrics.requests import Columns, distribution, done_mask, numbers

DIMENSIONS = ("slo_class", "tenant", "priority")
MAX_CLASSES = 32  # values a dimension may have to be broken down (a priority per request is not a class)


def class_summary(records: Columns) -> dict[str, Any]:
    """``{dimension: {class: {requests, finished, ttft_s, tpot_s, e2e_s}}, "session": {...}}``; empty for a run
    of one class."""
    if "slo_class" not in getattr(records, "column_names", ("slo_class",)):
        return {}  # records written before the labels were kept
    done = done_mask(records)
    latencies = {f"{name}_s": numbers(records, name) for name in ("ttft", "tpot", "e2e")}
    out: dict[str, Any] = {}
    for dim in DIMENSIONS:
        column = _plain(records.column(dim))
        values = [v for v in pc.unique(column).to_pylist() if v is not None]
        if not values or len(values) > MAX_CLASSES or (len(values) == 1 and dim != "slo_class"):
            continue
        out[dim] = {}
        for value in sorted(values, key=str):
            mask = pc.fill_null(pc.equal(column, pa.scalar(value, column.type)), False).to_numpy(zero_copy_only=False)
            out[dim][str(value)] = {
                "requests": int(mask.sum()),
                "finished": int((mask & done).sum()),
                **{key: distribution(v[mask & done]) for key, v in latencies.items()},
            }
    sessions = _sessions(records, done, latencies["ttft_s"])
    if sessions is not None:
        out["session"] = sessions
    return out


def _plain(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A label column as plain values (a file's is read dictionary-encoded)."""
    if pa.types.is_dictionary(column.type):
        return pa.chunked_array([chunk.dictionary_decode() for chunk in column.chunks], column.type.value_type)
    return column


def _sessions(records: Columns, done: np.ndarray, ttft: np.ndarray) -> dict[str, Any] | None:
    """Over the sessions: how many, and the distribution of each session's mean TTFT (its finished turns)."""
    session = _plain(records.column("session_id"))
    if session.null_count == len(session):
        return None
    table = pa.table({"session": session, "ttft": pa.array(np.where(done, ttft, np.nan), from_pandas=True)})
    table = table.filter(pc.is_valid(table["session"]))
    means = table.group_by("session").aggregate([("ttft", "mean")])["ttft_mean"].to_numpy(zero_copy_only=False)
    return {"sessions": len(means), "requests": table.num_rows, "mean_ttft_s": distribution(means)}


SESSION_MEANS = "a session's mean"  # the class of the per-session rows


def class_rows(summary: dict[str, Any]) -> dict[str, float | None]:
    """A summary's per-class numbers as a comparison's unit row reads them, keyed ``CLASS|METRIC``
    (``slo_class=interactive|ttft_mean_s``; over sessions, ``a session's mean|ttft_p99_s``: the p99 of the
    sessions' mean TTFTs)."""
    row: dict[str, float | None] = {}
    for dim, classes in (summary.get("classes") or {}).items():
        if dim == "session":
            for stat in ("p50", "p99"):
                row[f"{SESSION_MEANS}|ttft_{stat}_s"] = classes["mean_ttft_s"][stat]
            continue
        for name, c in classes.items():
            for key, stat in (("ttft", "mean"), ("ttft", "p99"), ("e2e", "p50")):
                row[f"{dim}={name}|{key}_{stat}_s"] = c[f"{key}_s"][stat]
    return row


def class_table(summary: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The per-class results as a table (a heading and rows of text; none for a run of one class): what the
    printed summary and report.html show."""
    classes = summary.get("classes") or {}
    head = ["class", "requests (finished)", "TTFT mean / p99 (s)", "TPOT mean (ms)", "E2E p50 / p99 (s)"]
    rows = []
    for dim, values in classes.items():
        if dim == "session":
            d = values["mean_ttft_s"]
            rows.append(
                [
                    f"{values['sessions']:,} sessions: a session's mean TTFT",
                    f"{values['requests']:,}",
                    f"{_num(d['mean'])} / {_num(d['p99'])} (p50 {_num(d['p50'])})",
                    "–",
                    "–",
                ]
            )
            continue
        for name, c in values.items():
            ttft, e2e = c["ttft_s"], c["e2e_s"]
            counts = f"{c['requests']:,} ({c['finished']:,})"
            rows.append(
                [
                    f"{dim} {name}",
                    counts,
                    f"{_num(ttft['mean'])} / {_num(ttft['p99'])}",
                    _num(c["tpot_s"]["mean"], 1000),
                    f"{_num(e2e['p50'])} / {_num(e2e['p99'])}",
                ]
            )
    return head, rows


def _num(value: float | None, scale: float = 1.0) -> str:
    return "–" if value is None else f"{value * scale:.3g}"
