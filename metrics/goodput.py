"""SLO goodput: requests that finished within both latency targets, per second and as a share.

A request meets the SLO when it finished and its TTFT <= ``ttft`` and its TPOT <= ``tpot``
(a one-token answer has no TPOT and meets that half). Ignored and aborted requests never meet it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvsched.metrics.requests import RequestMetrics

_DONE = ("FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED")


def meets_slo(m: RequestMetrics, ttft: float | None, tpot: float | None) -> bool:
    if m.status not in _DONE:
        return False
    if ttft is not None and (m.ttft is None or m.ttft > ttft):
        return False
    return tpot is None or m.tpot is None or m.tpot <= tpot


def goodput_summary(metrics: list[RequestMetrics], duration_s: float, ttft: float | None, tpot: float | None) -> dict:
    good = [m for m in metrics if meets_slo(m, ttft, tpot)]
    return {
        "slo_ttft_s": ttft,
        "slo_tpot_s": tpot,
        "requests_meeting_slo": len(good),
        "slo_attainment": len(good) / len(metrics) if metrics else 0.0,
        "goodput_requests_per_s": len(good) / duration_s if duration_s > 0 else 0.0,
        "goodput_tokens_per_s": sum(m.output_tokens for m in good) / duration_s if duration_s > 0 else 0.0,
    }
