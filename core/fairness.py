"""Fairness across tenants: Jain's index of service received and the largest service gap.

Service is the work the engine did for a tenant, weighted as in VTC (Sheng et al., OSDI'24): a
prefill (or recomputed) token weighs 1, a decoded token 2, counted step by step. Jain's index
``(Σx)² / (n·Σx²)`` over the tenants' totals is 1 when all receive the same and ``1/n`` when one
receives everything. The max service gap is the largest difference in cumulative service
between two tenants that both had requests waiting or running in a step (a backlogged
tenant falling behind another is what fairness forbids; an idle tenant is owed nothing).
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvsched.core.metrics import RequestMetrics
    from kvsched.core.report import StepReport
    from kvsched.core.request import Request

PROMPT_WEIGHT, OUTPUT_WEIGHT = 1, 2


def jain_index(values: list[float]) -> float | None:
    if not values:
        return None
    total, squares = sum(values), sum(v * v for v in values)
    return 1.0 if squares == 0 else total * total / (len(values) * squares)


class TenantService:
    """``on_step`` observer tracking each tenant's cumulative service and backlog."""

    def __init__(self, requests: list[Request]) -> None:
        self.arrivals = sorted((r.arrival_time, r.tenant) for r in requests)
        self.tenants = sorted({t for _, t in self.arrivals})
        self.service: dict[str, float] = defaultdict(float)
        self.unfinished: dict[str, int] = defaultdict(int)
        self._next = 0
        self.max_gap = 0.0
        self.max_gap_time: float | None = None

    def __call__(self, r: StepReport) -> None:
        if len(self.tenants) < 2:
            return
        arrivals, i = self.arrivals, self._next
        while i < len(arrivals) and arrivals[i][0] <= r.now - r.duration:  # admitted to the engine before this step
            self.unfinished[arrivals[i][1]] += 1
            i += 1
        self._next = i
        for sg in r.output.scheduled:
            self.service[sg.group.request.tenant] += sg.num_tokens * (PROMPT_WEIGHT if sg.is_prefill else OUTPUT_WEIGHT)
        backlogged = [self.service[t] for t, n in self.unfinished.items() if n > 0]
        if len(backlogged) > 1:
            gap = max(backlogged) - min(backlogged)
            if gap > self.max_gap:
                self.max_gap, self.max_gap_time = gap, r.now
        for g in r.finished:
            self.unfinished[g.request.tenant] -= 1


def fairness_summary(metrics: list[RequestMetrics], service: TenantService | None = None) -> dict:
    """Per-tenant requests, finished and service; Jain's index over tenants; the max service gap."""
    per: dict[str, dict] = {}
    for m in metrics:
        t = per.setdefault(m.tenant, {"requests": 0, "finished": 0, "service": 0.0})
        t["requests"] += 1
        if m.status in ("FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED"):
            t["finished"] += 1
    tracked = service is not None and len(service.tenants) > 1
    for name, t in per.items():
        t["service"] = service.service.get(name, 0.0) if tracked else None
    return {
        "tenants": per,
        "jain_index": jain_index([t["service"] for t in per.values()]) if tracked else 1.0,
        "max_service_gap": service.max_gap if tracked else 0.0,
        "max_service_gap_time_s": service.max_gap_time if tracked else None,
    }
