"""Inter-token latency (ITL, as ``vllm bench serve`` reports it): the gap before each token a request
receives after its first, over every token of the run, replayed from the decision log.

No token times are stored. The log says who did *not* run in each step (``left_out`` rows, waits of
running requests, preemptions), so every other request that was decoding when the step began got
a token at its end. Requests whose last token came at the same time share a bucket; a step that
runs them all merges the buckets into one (one gap per bucket, weighted by its size), so the
replay costs the steps and the decisions, not the tokens. A preempted request keeps the time of
its last token: its next token, after the re-prefill or the swap-in, is one long gap.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pandas as pd


class _Bucket:
    __slots__ = ("time", "members")

    def __init__(self, time: float, members: set[str]) -> None:
        self.time, self.members = time, members


def inter_token_latencies(events: pd.DataFrame, steps: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """``(gaps_s, counts)``: each distinct gap and how many tokens came after it (one stream per request)."""
    gaps: defaultdict[float, int] = defaultdict(int)
    where: dict[str, _Bucket] = {}  # decoding request -> its bucket
    buckets: set[_Bucket] = set()
    paused: dict[str, float] = {}  # preempted after some tokens -> the time of its last one
    end = steps.time_s.to_numpy()
    decodes = steps.decode_seqs.to_numpy()
    by_step = _rows_by_step(events)

    def leave(rid: str) -> _Bucket | None:
        b = where.pop(rid, None)
        if b is not None:
            b.members.discard(rid)
            if not b.members:
                buckets.discard(b)
        return b

    for s in range(len(end)):
        rows = by_step.get(s, ())
        held_out: dict[str, float] = {}  # decoding, but not run in this step: keep their last token time
        for event, rid, _reason, queue, _left in rows:
            if event == "preempted":
                b = leave(rid)
                if b is not None:
                    paused[rid] = b.time
            elif rid is not None and rid in where and (event == "left_out" or (event == "wait" and queue == "running")):
                held_out[rid] = leave(rid).time
        now, current = end[s], None
        if decodes[s] and buckets:
            for b in buckets:
                gaps[now - b.time] += len(b.members)
            current = max(buckets, key=lambda b: len(b.members))
            for b in buckets:
                if b is not current:
                    for rid in b.members:
                        where[rid] = current
                    current.members |= b.members
            current.time = now
            buckets.clear()
            buckets.add(current)
        for rid, t in held_out.items():  # back in a bucket of their own time
            _join(rid, t, where, buckets)
        for event, rid, _reason, _queue, left in rows:
            if (event in ("admitted", "prefill") and left == 0) or (event == "swapped_in" and not _chunked(rows, rid)):
                if rid in paused:
                    gaps[now - paused.pop(rid)] += 1
                _join(rid, now, where, buckets)
            elif event == "finished":
                leave(rid)
    values = np.fromiter(gaps.keys(), float, len(gaps))
    counts = np.fromiter(gaps.values(), np.int64, len(gaps))
    order = np.argsort(values)
    return values[order], counts[order]


def _join(rid: str, time: float, where: dict[str, _Bucket], buckets: set[_Bucket]) -> None:
    for b in buckets:
        if b.time == time:
            b.members.add(rid)
            where[rid] = b
            return
    b = _Bucket(time, {rid})
    buckets.add(b)
    where[rid] = b


def _chunked(rows, rid: str) -> bool:
    """A request swapped back in the middle of its prompt continues with a prefill chunk, not a token."""
    return any(e == "prefill" and r == rid and left for e, r, _reason, _queue, left in rows)


def _rows_by_step(events: pd.DataFrame) -> dict[int, list[tuple]]:
    wanted = events[
        events.event.isin(("admitted", "prefill", "swapped_in", "preempted", "finished", "left_out", "wait"))
    ]
    left = wanted.tokens_left.fillna(0).astype("int64")
    by_step: dict[int, list[tuple]] = defaultdict(list)
    for row in zip(wanted.step.to_numpy(), wanted.event, wanted.request_id, wanted.reason, wanted.queue, left):
        by_step[int(row[0])].append(row[1:])
    return by_step


def weighted_percentiles(values: np.ndarray, counts: np.ndarray, qs=(50, 90, 99)) -> dict[str, float | None]:
    """mean and percentiles of ``values`` each repeated ``counts`` times (linear interpolation, as numpy's default)."""
    total = int(counts.sum())
    if total == 0:
        return {"mean": None, **{f"p{q}": None for q in qs}}
    cum = np.cumsum(counts)
    out = {"mean": float((values * counts).sum() / total)}
    for q in qs:
        pos = (total - 1) * q / 100
        lo, hi = int(np.floor(pos)), int(np.ceil(pos))
        v_lo, v_hi = values[np.searchsorted(cum, lo + 1)], values[np.searchsorted(cum, hi + 1)]
        out[f"p{q}"] = float(v_lo + (v_hi - v_lo) * (pos - lo))
    return out
