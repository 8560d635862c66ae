"""What a run's figures do not say by themselves: requests it did not serve, and a load it never caught up with.

Latencies and throughput are measured over the requests that finished, so a run that ignored
the long prompts, or lost requests, looks better than the service it models; and a run whose
waiting queue never empties measures how long the run was, not the engine. Each warning is
``{"count": N, "reason": "..."}``, read as "N requests <reason>"; ``summary.json`` lists them under ``warnings``, the
terminal summary ends with them and ``report.html`` shows them above its table.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

import numpy as np
import pyarrow.compute as pc

UNSERVED = (("FINISHED_IGNORED", "ignored"), ("FINISHED_ABORTED", "aborted"))
MAX_REASONS = 5  # distinct reasons listed per status; the rest are counted together
OVERLOAD_SHARE = 0.5  # the queue never emptied over at least this share of the arrival period
_NUMBER = re.compile(r"\(\d+\)|\d+")  # a number in parentheses is a setting, shown as it is; the others vary


def warning_text(warning: dict[str, Any], num_requests: int | None = None) -> str:
    """One warning as a line: "N [of M] requests <reason>"."""
    of = "" if num_requests is None else f" of {num_requests:,}"
    return f"{warning['count']:,}{of} requests {warning['reason']}"


def run_warnings(records: Any) -> list[dict[str, Any]]:
    """The warnings of a run, from its per-request records as columns (``metrics.requests.Columns``)."""
    status = records.column("status")
    found = []
    for name, verb in UNSERVED:
        details = pc.filter(records.column("detail"), pc.equal(status, name)).to_pylist()
        found += _by_reason(details, verb)
    overload = _overload(records)
    if overload is not None:
        found.append(overload)
    return found


def _by_reason(details: list[str | None], verb: str) -> list[dict[str, Any]]:
    """One warning per distinct reason (numbers that vary shown as their range), most frequent first."""
    groups: dict[str, list[list[int]]] = defaultdict(list)
    for detail in details:
        text = (detail or "no reason recorded").replace("{", "{{").replace("}", "}}")
        groups[_NUMBER.sub(lambda m: m[0] if m[0].startswith("(") else "{}", text)].append(
            [int(m) for m in _NUMBER.findall(text) if not m.startswith("(")]
        )
    ranked = sorted(groups.items(), key=lambda kv: -len(kv[1]))
    out = [
        {"count": len(values), "reason": f"{verb}: {_fill(template, values)}"}
        for template, values in ranked[:MAX_REASONS]
    ]
    rest = sum(len(values) for _, values in ranked[MAX_REASONS:])
    if rest:
        out.append({"count": rest, "reason": f"{verb}: {len(ranked) - MAX_REASONS} other reasons"})
    return out


def _fill(template: str, values: list[list[int]]) -> str:
    columns = zip(*values)
    return template.format(*(f"{min(c):,}" if min(c) == max(c) else f"{min(c):,}–{max(c):,}" for c in columns))


def _overload(records) -> dict[str, Any] | None:
    """A waiting queue that did not empty once over the later part of the arrivals (``OVERLOAD_SHARE``).

    A request waits from its arrival until it is first scheduled (or ends unscheduled); the
    queue is empty at a moment when as many requests have left it as have arrived."""
    arrival = records.column("arrival_time").to_numpy()
    left = records.column("first_scheduled_time").to_numpy()
    if len(arrival) < 2 or np.isnan(left).all():  # a client cannot see when a request was scheduled
        return None
    left = np.where(np.isnan(left), records.column("finish_time").to_numpy(), left)
    first, last = float(arrival.min()), float(arrival.max())
    if last <= first:
        return None
    times = np.concatenate([arrival, left])
    steps = np.concatenate([np.ones(len(arrival)), -np.ones(len(left))])
    order = np.lexsort(
        (-steps, times)
    )  # at one instant, arrivals before departures: a request served at once never waits
    queue = np.cumsum(steps[order])
    empty = times[order][(queue == 0) & (times[order] <= last)]
    drained = float(empty.max()) if len(empty) else first
    if last - drained < OVERLOAD_SHARE * (last - first):
        return None
    return {
        "count": int((arrival > drained).sum()),
        "reason": (
            f"arrived after the waiting queue last emptied, {drained - first:.1f} s into {last - first:.1f} s of "
            "arrivals (overload): their latencies grow with the length of the run, not with the engine's speed"
        ),
    }
