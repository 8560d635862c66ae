"""SLO goodput: requests that finished within both latency targets, per second and as a share.

A request meets the SLO when it finished and its TTFT <= ``ttft`` and its TPOT <= ``tpot``
(a one-token answer has no TPOT and meets that half). Ignored and aborted requests never meet it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvsched.metrics.requests import as_columns, done_mask, exact_sum, numbers


def meets_slo(records: Any, ttft: float | None, tpot: float | None) -> np.ndarray:
    """Per request (a list of ``RequestMetrics`` or columns), whether it met the SLO."""
    records = as_columns(records)
    good = done_mask(records)
    if ttft is not None:
        good &= numbers(records, "ttft") <= ttft  # a missing TTFT (NaN) compares False
    if tpot is not None:
        t = numbers(records, "tpot")
        good &= np.isnan(t) | (t <= tpot)
    return good


def goodput_summary(metrics: Any, duration_s: float, ttft: float | None, tpot: float | None) -> dict:
    metrics = as_columns(metrics)
    good = meets_slo(metrics, ttft, tpot)
    num_good = int(good.sum())
    return {
        "slo_ttft_s": ttft,
        "slo_tpot_s": tpot,
        "requests_meeting_slo": num_good,
        "slo_attainment": num_good / metrics.num_rows if metrics.num_rows else 0.0,
        "goodput_requests_per_s": num_good / duration_s if duration_s > 0 else 0.0,
        "goodput_tokens_per_s": exact_sum(numbers(metrics, "output_tokens")[good]) / duration_s
        if duration_s > 0
        else 0.0,
    }
