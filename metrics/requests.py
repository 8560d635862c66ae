"""Per-request latency metrics and the run summary (``summary.json``)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from kvsched.core.sequence import SequenceStatus

if TYPE_CHECKING:
    from kvsched.core.engine import Engine
    from kvsched.core.sequence import SequenceGroup


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

    @classmethod
    def of(cls, g: SequenceGroup) -> RequestMetrics:
        arrival = g.arrival_time
        longest = max(len(s.output) for s in g.seqs)
        ttft = None if g.first_token_time is None else g.first_token_time - arrival
        tpot = None
        if g.finish_time is not None and g.first_token_time is not None and longest > 1:
            tpot = (g.finish_time - g.first_token_time) / (longest - 1)
        return cls(
            request_id=g.request_id,
            status=g.status.name,
            finish_reason=g.status.finish_reason,
            detail=g.finish_detail,
            priority=g.request.priority,
            tenant=g.request.tenant,
            n=g.request.sampling.n,
            prompt_tokens=g.request.prompt_len,
            output_tokens=g.num_generated_tokens,
            arrival_time=arrival,
            first_scheduled_time=g.first_scheduled_time,
            first_token_time=g.first_token_time,
            finish_time=g.finish_time,
            queueing_time=None if g.first_scheduled_time is None else g.first_scheduled_time - arrival,
            ttft=ttft,
            tpot=tpot,
            e2e=None if g.finish_time is None or g.status is SequenceStatus.FINISHED_IGNORED else g.finish_time - arrival,
            preemptions_recompute=g.num_recompute_preemptions,
            preemptions_swap=g.num_swap_preemptions,
        )

    def as_dict(self) -> dict:
        """The fields by name. All are scalars, so no deep copy (``dataclasses.asdict`` made a
        tenth of ``engine run``'s time on the Azure trace)."""
        return {name: getattr(self, name) for name in _FIELDS}


_FIELDS = tuple(f.name for f in fields(RequestMetrics))


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default) of an already sorted list."""
    if not sorted_values:
        return float("nan")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def distribution(values: list[float | None]) -> dict[str, float | None]:
    """mean, p50, p90, p99 of the non-missing values (None when there are none)."""
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    return {
        "mean": sum(vals) / len(vals),
        "p50": percentile(vals, 50),
        "p90": percentile(vals, 90),
        "p99": percentile(vals, 99),
    }


def summarize(engine: Engine | None, requests: list[RequestMetrics], **extra) -> dict:
    """The run summary: counts, throughput, latency distributions, preemptions, block audit.

    Without an engine (a run measured from a client, ``engine bench``) what only the engine knows
    (policy, steps, preemptions, swaps, leaks, config) is None, unless ``extra`` says it.
    """
    done = [r for r in requests if r.status in ("FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED")]
    start = min((r.arrival_time for r in requests), default=0.0)
    end = max((r.finish_time for r in requests if r.finish_time is not None), default=start)
    duration = end - start
    out_tokens = sum(r.output_tokens for r in done)
    known = engine is not None
    policy = engine.policy_name if known else extra.pop("policy", None)
    config = engine.config.model_dump(mode="json") if known else extra.pop("config", None)
    return {
        "policy": policy,
        **extra,
        "num_requests": len(requests),
        "finished": len(done),
        "ignored": sum(r.status == "FINISHED_IGNORED" for r in requests),
        "aborted": sum(r.status == "FINISHED_ABORTED" for r in requests),
        "duration_s": duration,
        "steps": engine.num_steps if known else None,
        "requests_per_s": len(done) / duration if duration > 0 else 0.0,
        "throughput_tokens_per_s": out_tokens / duration if duration > 0 else 0.0,
        "output_tokens": out_tokens,
        "ttft_s": distribution([r.ttft for r in done]),
        "tpot_s": distribution([r.tpot for r in done]),
        "e2e_s": distribution([r.e2e for r in done]),
        "queueing_s": distribution([r.queueing_time for r in done]),
        "preemptions": {
            "recompute": sum(r.preemptions_recompute for r in requests),
            "swap": sum(r.preemptions_swap for r in requests),
        } if known else None,
        "blocks_swapped_in": engine.num_blocks_swapped_in if known else None,
        "blocks_swapped_out": engine.num_blocks_swapped_out if known else None,
        "leaked_blocks": engine.leaked_blocks if known else None,
        "config": config,
    }
