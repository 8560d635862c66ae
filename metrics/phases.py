"""A request's life as phases (queued, prefill, decode, preempted, swapped), read from the decision log.

A phase begins and ends at step boundaries: admission and preemption take effect when their step
begins, the last prefill chunk and the last token when it ends. ``preempted`` is the time a
request spent back in the waiting queue after a preemption by recompute; ``swapped`` the time its
blocks spent on the CPU after a preemption by swap.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import pandas as pd

WAITING_PHASES = {"queued": "waiting", "preempted": "waiting", "swapped": "swapped"}
_STATE_EVENTS = ("admitted", "prefill", "swapped_in", "preempted", "ignored", "finished")


@dataclass
class Phase:
    kind: str  # queued, prefill, decode, preempted, swapped
    start_s: float
    end_s: float
    first_step: int  # the steps that began inside it
    last_step: int
    detail: str = ""  # for preempted and swapped: the mode, and for whom


def state_rows(events: pd.DataFrame) -> pd.DataFrame:
    """The rows that change a request's phase, with the fields ``phases_of`` reads."""
    rows = events[events.event.isin(_STATE_EVENTS) & events.request_id.notna()]
    return rows[["request_id", "event", "step", "tokens_left", "reason", "other_request"]]


def phases_of(rows, arrival: float, finish: float | None, start: np.ndarray, end: np.ndarray) -> list[Phase]:
    """The phases of one request from its ``state_rows`` (``(event, step, tokens_left, reason,
    other_request)`` tuples, in log order); ``start``/``end``: each step's times."""
    spans: list[tuple[str, float, float, str]] = []
    kind, since, detail = "queued", arrival, ""

    def switch(new: str | None, t: float, new_detail: str = "") -> None:
        nonlocal kind, since, detail
        spans.append((kind, since, t, detail))
        kind, since, detail = new, t, new_detail

    for event, step, left, reason, other in rows:
        if event in ("admitted", "prefill"):
            if kind != "prefill":
                switch("prefill", start[step])
            if not left:  # the prompt's last chunk: the first token comes at the step's end
                switch("decode", end[step])
        elif event == "swapped_in":  # it runs in that step (a prefill row follows if it was mid-prompt)
            switch("decode", start[step])
        elif event == "preempted":
            switch(
                "swapped" if reason == "swap" else "preempted",
                start[step],
                f"{reason}, for {other}" if isinstance(other, str) else f"{reason}, by the policy",
            )
        elif event in ("finished", "ignored"):
            switch(None, end[step] if event == "finished" else start[step])
            break
    if kind is not None and finish is not None and not np.isnan(finish):  # aborted: the log has no row for it
        switch(None, finish)
    return [
        Phase(k, a, b, int(np.searchsorted(start, a - 1e-9)), int(np.searchsorted(start, b - 1e-9)) - 1, d)
        for k, a, b, d in spans
        if b > a
    ]


def sampled_ids(events: pd.DataFrame, requests: pd.DataFrame) -> dict[str, list[str]]:
    """Each request's ids in the log: its own, or, where vLLM V1's mechanics fanned a request with ``n > 1``
    out into ``n`` requests ``"{i}_{request_id}"`` (mechanics/fanout.py), those of the children the log names."""
    logged = set(events.request_id.dropna())
    ids = {}
    for rid, n in zip(requests.request_id, requests.n):
        children = [f"{i}_{rid}" for i in range(int(n))] if n > 1 else []
        ids[rid] = [c for c in children if c in logged] or [rid]
    return ids


def all_phases(
    events: pd.DataFrame,
    requests: pd.DataFrame,
    start: np.ndarray,
    end: np.ndarray,
    ids: dict[str, list[str]] | None = None,
) -> dict[str, list[Phase]]:
    """``phases_of`` for every id ``sampled_ids`` gives (a fanned-out request's children, each on its own,
    with their parent's arrival and end), in one pass over the log."""
    rows = state_rows(events)
    by_request: dict[str, list[tuple]] = defaultdict(list)
    for rid, *row in zip(
        rows.request_id, rows.event, rows.step.to_numpy(), rows.tokens_left.to_numpy(), rows.reason, rows.other_request
    ):
        by_request[rid].append(row)
    ids = sampled_ids(events, requests) if ids is None else ids
    return {
        sid: phases_of(by_request.get(sid, ()), arrival, finish, start, end)
        for rid, arrival, finish in zip(requests.request_id, requests.arrival_time, requests.finish_time)
        for sid in ids[rid]
    }
