"""Per-request latency metrics and the run summary (``summary.json``).

The summary is computed from columns (``Columns``): an in-memory run's records become an Arrow
table, a streamed run's are read back from their Parquet file one column at a time, and both give
the same numbers, bit for bit (sums are taken in order, as Python's ``sum`` takes them).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvsched.core.sequence import SequenceStatus
from kvsched.metrics.warnings import run_warnings
from kvsched.plugins.identity import policy_attribute

if TYPE_CHECKING:
    from kvsched.core.engine import Engine
    from kvsched.core.sequence import SequenceGroup

DONE = ("FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED")


@dataclass(frozen=True)
class RequestMetrics:
    """One request's timeline (engine-clock seconds) and what happened to it."""

    request_id: str
    status: str
    finish_reason: str | None
    detail: str | None
    priority: int
    tenant: str
    n: int
    prompt_tokens: int
    output_tokens: int
    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    finish_time: float | None
    queueing_time: float | None
    ttft: float | None
    tpot: float | None
    e2e: float | None
    preemptions_recompute: int
    preemptions_swap: int
    recomputed_tokens: int = 0  # the recompute tax's counts (metrics/recompute.py)
    discarded_tokens: int = 0
    computed_tokens: int = 0
    slo_class: str | None = None  # the request's labels, what per-class results group by (metrics/classes.py)
    session_id: str | None = None

    @classmethod
    def of(cls, g: SequenceGroup) -> RequestMetrics:
        """``g``'s record (``request_row``'s values, by name)."""
        return cls(*request_row(g))

    def as_dict(self) -> dict:
        """The fields by name. All are scalars, so no deep copy (``dataclasses.asdict`` made a
        tenth of ``engine run``'s time on the Azure trace)."""
        return {name: getattr(self, name) for name in FIELDS}


FIELDS = tuple(f.name for f in fields(RequestMetrics))
_IGNORED = SequenceStatus.FINISHED_IGNORED


def request_row(g: SequenceGroup) -> tuple:
    """``g``'s record as a row, its values in ``FIELDS`` order: what a run's records keep and stream (one request at
    a time, so no ``RequestMetrics`` is made where only the row is kept)."""
    request, seqs, status = g.request, g.seqs, g.status
    arrival, scheduled, first, finish = g.arrival_time, g.first_scheduled_time, g.first_token_time, g.finish_time
    longest = len(seqs[0].output) if len(seqs) == 1 else max([len(s.output) for s in seqs])
    tpot = None
    if finish is not None and first is not None and longest > 1:
        tpot = (finish - first) / (longest - 1)
    # The recompute tax's counts (metrics/recompute.py): each admission computed from its cache hit to where it stopped.
    computed = sum([s.num_computed_tokens for s in seqs])
    return (
        g.request_id,
        status.name,
        status.finish_reason,
        g.finish_detail,
        request.priority,
        request.tenant,
        request.sampling.n,
        request.prompt_len,
        g.num_generated_tokens,
        arrival,
        scheduled,
        first,
        finish,
        None if scheduled is None else scheduled - arrival,
        None if first is None else first - arrival,
        tpot,
        None if finish is None or status is _IGNORED else finish - arrival,
        g.num_recompute_preemptions,
        g.num_swap_preemptions,
        g.num_recomputed_tokens,
        g.num_discarded_tokens,
        g.num_discarded_tokens + computed - g.num_prefix_hit_tokens,
        request.slo_class,
        request.session_id,
    )


def offloading_summary(engine: Engine | None, recompute: dict | None) -> dict:
    """With a CPU KV tier (``kv_offloading_blocks``): its own key, where prefix hits are split by tier and the
    recompute tax into what was reloaded from the CPU and what was computed again; without one, nothing."""
    offloading = getattr(getattr(engine, "scheduler", None), "offloading", None)
    if offloading is None:
        return {}
    tier = offloading.summary()
    recomputed = recompute["recomputed_tokens"]
    redone = tier["reloaded_tokens"] + recomputed
    return {
        "cpu_tier": {
            **tier,
            "recomputed_tokens": recomputed,
            "reloaded_share": tier["reloaded_tokens"] / redone if redone else 0.0,
        }
    }


class Columns(Protocol):
    """What the summaries read: an Arrow table, or ``metrics.records.RequestTable``."""

    num_rows: int

    def column(self, name: str) -> pa.ChunkedArray: ...


def as_columns(records: Any) -> Columns:
    """``records`` as columns: a list of ``RequestMetrics`` becomes an Arrow table; columns stay as they are."""
    if isinstance(records, list):
        from kvsched.metrics.records import records_table

        return records_table(records)
    return records


def numbers(records: Columns, name: str) -> np.ndarray:
    """One numeric column as a numpy array (NaN where a time is missing)."""
    return records.column(name).to_numpy()


def done_mask(records: Columns) -> np.ndarray:
    """True for the requests that finished (stopped or length-capped), as a numpy array."""
    return pc.is_in(records.column("status"), value_set=pa.array(DONE)).to_numpy(zero_copy_only=False)


def exact_sum(values: np.ndarray) -> int | float:
    """The sum of a column, exact however many rows: numpy adds int64 in int64 and would wrap past 2**63
    unnoticed, so an int column too long for that is added in chunks that cannot wrap, as Python ints.
    (The bounds on tokens and requests keep every real run inside one chunk: this is the proof of it.)"""
    if values.dtype.kind not in "iu" or not len(values):
        return values.sum().item() if len(values) else 0
    rows = (1 << 63) // max(1, int(np.abs(values).max()) + 1)  # rows whose sum fits int64
    if rows >= len(values):
        return int(values.sum())
    return sum(int(values[i : i + rows].sum()) for i in range(0, len(values), rows))


def ordered_sum(values: np.ndarray) -> float:
    """Left-to-right sum, as Python's ``sum`` adds floats (numpy's own sum pairs them, so its last bits differ)."""
    return float(np.add.accumulate(values)[-1]) if len(values) else 0


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default) of an already sorted list or array."""
    if not len(sorted_values):
        return float("nan")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def distribution(values: Any) -> dict[str, float | None]:
    """mean, p50, p90, p99 of the values that are not missing (None or NaN; None when there are none)."""
    values = np.asarray(values, dtype=np.float64)  # a list's None becomes NaN
    vals = np.sort(values[~np.isnan(values)])
    if not len(vals):
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    return {
        "mean": ordered_sum(vals) / len(vals),
        "p50": float(percentile(vals, 50)),
        "p90": float(percentile(vals, 90)),
        "p99": float(percentile(vals, 99)),
    }


def summarize(engine: Engine | None, requests: Any, **extra) -> dict:
    """The run summary: counts, throughput, latency distributions, preemptions, block audit, warnings.

    ``requests``: the records, as a list of ``RequestMetrics`` or as ``Columns``. Without an engine
    (a run measured from a client, ``engine bench``) what only the engine knows (policy, steps,
    preemptions, swaps, leaks, config) is None, unless ``extra`` says it.
    """
    from kvsched.metrics.classes import class_summary
    from kvsched.metrics.recompute import recompute_summary

    requests = as_columns(requests)
    done = done_mask(requests)
    num_done = int(done.sum())
    status = requests.column("status")
    arrival, finish = numbers(requests, "arrival_time"), numbers(requests, "finish_time")
    finish = finish[~np.isnan(finish)]
    start = float(arrival.min()) if len(arrival) else 0.0
    end = float(finish.max()) if len(finish) else start
    duration = end - start
    out_tokens = exact_sum(numbers(requests, "output_tokens")[done])
    known = engine is not None
    policy = engine.policy_name if known else extra.pop("policy", None)
    predictor = (
        policy_attribute(engine.hooks.policy, "length_predictor", None)
        if known
        else extra.pop("length_predictor", None)
    )
    config = engine.config.model_dump(mode="json") if known else extra.pop("config", None)
    return {
        "policy": policy,
        "length_predictor": predictor
        if isinstance(predictor, str)
        else None,  # how the policy knew output lengths, if it did
        **extra,
        "num_requests": requests.num_rows,
        "finished": num_done,
        "ignored": int(pc.sum(pc.equal(status, "FINISHED_IGNORED")).as_py() or 0),
        "aborted": int(pc.sum(pc.equal(status, "FINISHED_ABORTED")).as_py() or 0),
        "duration_s": duration,
        "steps": engine.num_steps if known else None,
        "requests_per_s": num_done / duration if duration > 0 else 0.0,
        "throughput_tokens_per_s": out_tokens / duration if duration > 0 else 0.0,
        "output_tokens": out_tokens,
        "ttft_s": distribution(numbers(requests, "ttft")[done]),
        "tpot_s": distribution(numbers(requests, "tpot")[done]),
        "e2e_s": distribution(numbers(requests, "e2e")[done]),
        "queueing_s": distribution(numbers(requests, "queueing_time")[done]),
        "preemptions": {
            "recompute": exact_sum(numbers(requests, "preemptions_recompute")),
            "swap": exact_sum(numbers(requests, "preemptions_swap")),
        }
        if known
        else None,
        "recompute": (recompute := recompute_summary(requests) if known else None),
        **offloading_summary(engine, recompute),
        "blocks_swapped_in": engine.num_blocks_swapped_in if known else None,
        "blocks_swapped_out": engine.num_blocks_swapped_out if known else None,
        "leaked_blocks": engine.leaked_blocks if known else None,
        "config": config,
        "classes": class_summary(requests),
        "warnings": run_warnings(requests),
    }
