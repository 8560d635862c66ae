"""inference-perf's lifecycle metrics: one stage's (or a whole run's) latencies as its client reports them.

A simulated run and a real one are then read by the same tools: ``lifecycle_report`` makes the
``stage_N_lifecycle_metrics.json`` / ``summary_lifecycle_metrics.json`` schema of the published
result folders (the BLIS team's H100 runs): ``load_summary`` (count, schedule delay; a stage's
send duration, requested and achieved rate), ``successes`` (count; latency distributions of
``request_latency``, ``time_to_first_token``, ``time_per_output_token``,
``normalized_time_per_output_token`` and ``inter_token_latency``; throughput; ``prompt_len`` and
``output_len``) and ``failures`` (count, latency, prompt length), each distribution a mean, min,
max and the percentiles inference-perf reports (``numpy.percentile``, linear), in seconds and tokens.

What a client sees is the engine's timeline plus the serving stack's time outside it:
``client_requests`` adds ``api_s`` before the first token and ``response_s`` after the last
(``StepCost.serving_seconds``). The simulator keeps no per-token times, so a request's
``inter_token_latency`` gaps are its mean gap, once per token after the first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import numpy as np

from kvsched.userfiles.reader import FileError, read_json

PERCENTILES = (0.1, 1, 5, 10, 25, 50, 75, 90, 95, 99, 99.9)
LATENCIES = (
    "request_latency",
    "normalized_time_per_output_token",
    "time_per_output_token",
    "time_to_first_token",
    "inter_token_latency",
)


class ClientRequest(NamedTuple):
    """One request as inference-perf's client saw it (seconds on the client's clock)."""

    stage: int
    scheduled: float
    start: float
    ok: bool
    latency: float  # end to end (a failure: until the client gave up)
    ttft: float | None
    prompt_len: int  # what the server counted (0 for a failure, as inference-perf records it)
    output_len: int  # what the client counted


def client_requests(
    log: Iterable[Any],
    records: Iterable[Any],
    serving_seconds: tuple[float, float] = (0.0, 0.0),
    timeout_s: float = 300.0,
    counted: Mapping[str, int] | None = None,
) -> list[ClientRequest]:
    """Join a client log (``request_id``, ``stage``, ``scheduled``, ``sent``, ``outcome``: ok, timeout or
    refused) with the engine's records (``RequestMetrics``); ``counted``: the output tokens the client
    counts for a request, where it differs from what the engine generated."""
    api, response = serving_seconds
    engine = {r.request_id: r for r in records}
    out = []
    for c in log:
        if c.sent is None:
            continue
        if c.outcome != "ok":
            latency = timeout_s if c.outcome == "timeout" else api
            out.append(ClientRequest(c.stage, c.scheduled, c.sent, False, latency, None, 0, 0))
            continue
        r = engine[c.request_id]
        generated = r.output_tokens
        n = generated if counted is None else counted.get(c.request_id, generated)
        out.append(
            ClientRequest(
                c.stage,
                c.scheduled,
                c.sent,
                True,
                api + (r.finish_time - r.arrival_time) + response,
                api + (r.first_token_time - r.arrival_time),
                r.prompt_tokens,
                n,
            )
        )
    return out


def summarize(values: Iterable[float]) -> dict[str, float] | None:
    """inference-perf's distribution of ``values``: mean, min, max and its percentiles (None for none)."""
    data = np.asarray(list(values) if not isinstance(values, np.ndarray) else values, dtype=float)
    if not len(data):
        return None
    out = {"mean": float(np.mean(data)), "min": float(np.min(data))}
    for p, v in zip(PERCENTILES, np.percentile(data, PERCENTILES)):
        out["median" if p == 50 else f"p{p:g}"] = float(v)
    out["max"] = float(np.max(data))
    return out


def lifecycle_report(requests: list[ClientRequest], rate: float | None = None) -> dict[str, Any]:
    """One stage's report (``rate``: its requested rate) or, without it, a run's summary."""
    ok = [r for r in requests if r.ok]
    failed = [r for r in requests if not r.ok]
    load: dict[str, Any] = {
        "count": len(requests),
        "schedule_delay": summarize([r.start - r.scheduled for r in requests]),
    }
    if rate is not None and requests:
        send = max(r.start for r in requests) - min(r.start for r in requests)
        load.update(send_duration=send, requested_rate=rate, achieved_rate=len(requests) / send if send > 0 else 0.0)
    total = (max(r.start + r.latency for r in requests) - min(r.start for r in requests)) if requests else 0.0
    latency = np.array([r.latency for r in ok])
    counts = np.array([r.output_len for r in ok], dtype=float)
    ttft = np.array([r.ttft for r in ok])
    tpot = np.divide(latency - ttft, counts - 1, out=np.full(len(ok), np.nan), where=counts > 1)
    inputs, outputs = float(sum(r.prompt_len for r in ok)), float(counts.sum())
    gaps = np.repeat(tpot[counts > 1], (counts[counts > 1] - 1).astype(int))
    per_s = (lambda x: x / total) if total > 0 else (lambda x: 0.0)
    return {
        "load_summary": load,
        "successes": {
            "count": len(ok),
            "latency": {
                "request_latency": summarize(latency),
                "normalized_time_per_output_token": summarize(
                    np.divide(latency, counts, out=np.zeros(len(ok)), where=counts > 0)
                ),
                "time_per_output_token": summarize(tpot[counts > 1]),
                "time_to_first_token": summarize(ttft),
                "inter_token_latency": summarize(gaps),
            },
            "throughput": {
                "input_tokens_per_sec": per_s(inputs),
                "output_tokens_per_sec": per_s(outputs),
                "total_tokens_per_sec": per_s(inputs + outputs),
                "requests_per_sec": per_s(len(ok)),
            },
            "prompt_len": summarize([r.prompt_len for r in ok]),
            "output_len": summarize(counts),
        },
        "failures": {
            "count": len(failed),
            "request_latency": summarize([r.latency for r in failed]),
            "prompt_len": summarize([r.prompt_len for r in failed]),
        },
    }


def lifecycle_reports(requests: list[ClientRequest], rates: list[float]) -> dict[str, dict[str, Any]]:
    """Every file a run's report has, by name: one per stage (``rates``: each stage's), and the summary."""
    files = {}
    for s, rate in enumerate(rates):
        stage = [r for r in requests if r.stage == s]
        if stage:  # a stage the run never reached (cut short by -n) has no report, as in inference-perf
            files[f"stage_{s}_lifecycle_metrics.json"] = lifecycle_report(stage, rate)
    files["summary_lifecycle_metrics.json"] = lifecycle_report(requests)
    return files


def run_reports(
    workload: Any,
    records: Iterable[Any],
    serving_seconds: tuple[float, float],
    counted: Mapping[str, int] | None = None,
) -> dict[str, dict[str, Any]]:
    """The report files of a run an inference-perf workload drove (its ``client_log``, ``stages``, ``timeout_s``)."""
    requests = client_requests(workload.client_log, records, serving_seconds, workload.timeout_s, counted)
    return lifecycle_reports(requests, [s.rate for s in workload.stages])


def read_lifecycle(path) -> dict[str, Any]:
    """A recorded report file, checked to have the distributions a comparison reads."""
    data = read_json(path, "inference-perf report")
    try:
        latency = data["successes"]["latency"]
        for name in ("request_latency", "time_to_first_token", "normalized_time_per_output_token"):
            if not isinstance(latency[name], dict) or "mean" not in latency[name]:
                raise KeyError(name)
    except (KeyError, TypeError) as exc:
        missing = exc.args[0] if exc.args else "?"
        raise FileError(f"not an inference-perf lifecycle report: no successes.latency.{missing}", path) from None
    return data
