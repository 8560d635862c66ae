"""Fairness across tenants while they compete: Jain's index of service rates and the max service gap.

Service is weighted as in VTC (Sheng et al., OSDI'24): 1 per prefill (or recomputed) token, 2
per decoded token, counted step by step. A tenant is *backlogged* in a step when it has requests
waiting for admission at the step's start; only then does it compete, so only then is it owed
anything.

- ``jain_index``: Jain's index ``(Σx)² / (n·Σx²)`` of each tenant's service rate while
  backlogged (service in its backlogged steps ÷ their duration), over the tenants that were ever
  backlogged. 1 means every competing tenant was served at the same rate; ``1/n`` means one took
  it all. Raw totals would only measure demand, which differs between tenants by design.
- ``max_service_gap``: the largest difference between the VTC counters of two backlogged
  tenants. A tenant's counter grows with its service, and when it becomes backlogged again it is
  lifted to the smallest counter of the tenants already backlogged (VTC's rule), so idle time
  neither banks nor loses credit. VTC keeps this gap bounded; FCFS does not.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from kvsched.metrics.requests import as_columns, done_mask

if TYPE_CHECKING:
    from kvsched.core.report import StepReport
    from kvsched.core.request import Request

PROMPT_WEIGHT, OUTPUT_WEIGHT = 1, 2


def jain_index(values: list[float]) -> float | None:
    if not values:
        return None
    total, squares = sum(values), sum(v * v for v in values)
    return 1.0 if squares == 0 else total * total / (len(values) * squares)


class TenantService:
    """``on_step`` observer: per-tenant service, backlog (waiting requests) and VTC counters.

    It learns of the requests through ``watch``, which the engine's request stream passes through,
    so it holds only those not yet admitted; attach it only when the workload can have several
    tenants (with one, nobody competes and it would only cost time)."""

    def __init__(self) -> None:
        self.arrivals: deque[tuple[float, str, str]] = deque()  # handed to the engine, not yet counted as waiting
        self.tenants: set[str] = set()  # of the requests seen so far
        self.service: dict[str, float] = defaultdict(float)
        self.backlogged_service: dict[str, float] = defaultdict(float)
        self.backlogged_time: dict[str, float] = defaultdict(float)
        self.counters: dict[str, float] = defaultdict(float)
        self.waiting: dict[str, int] = defaultdict(int)
        self._waiting_ids: set[str] = set()
        self._backlogged: set[str] = set()
        self.max_gap = 0.0
        self.max_gap_time: float | None = None

    def watch(self, requests: Iterable[Request]) -> Iterator[Request]:
        """``requests``, in arrival order, passed on to the engine; each is noted as it goes."""
        arrivals, tenants = self.arrivals, self.tenants
        for r in requests:
            arrivals.append((r.arrival_time, r.request_id, r.tenant))
            tenants.add(r.tenant)
            yield r

    def __call__(self, r: StepReport) -> None:
        start = r.now - r.duration + 1e-9  # the engine admitted every request that arrived by then
        arrivals = self.arrivals
        while arrivals and arrivals[0][0] <= start:
            _, request_id, tenant = arrivals.popleft()
            self._waiting_ids.add(request_id)
            self.waiting[tenant] += 1
        backlogged = {t for t, n in self.waiting.items() if n > 0}
        counters = self.counters
        staying = backlogged & self._backlogged
        if staying:
            floor = min(counters[t] for t in staying)
            for t in backlogged - staying:  # VTC's lift for a tenant that starts competing again
                counters[t] = max(counters[t], floor)
        self._backlogged = backlogged
        step_service: dict[str, float] = defaultdict(float)
        for sg in r.output.scheduled:
            step_service[sg.group.request.tenant] += sg.num_tokens * (PROMPT_WEIGHT if sg.is_prefill else OUTPUT_WEIGHT)
        for t, x in step_service.items():
            self.service[t] += x
            counters[t] += x
        for t in backlogged:
            self.backlogged_service[t] += step_service.get(t, 0.0)
            self.backlogged_time[t] += r.duration
        if len(backlogged) > 1:
            values = [counters[t] for t in backlogged]
            gap = max(values) - min(values)
            if gap > self.max_gap:
                self.max_gap, self.max_gap_time = gap, r.now
        self._leave_waiting(g for g in (sg.group for sg in r.output.scheduled))
        self._leave_waiting(r.output.ignored)
        for g, mode in r.output.preempted:
            if mode.value == "recompute":  # back to the waiting queue
                self._waiting_ids.add(g.request_id)
                self.waiting[g.request.tenant] += 1

    def _leave_waiting(self, groups) -> None:
        for g in groups:
            if g.request_id in self._waiting_ids:
                self._waiting_ids.discard(g.request_id)
                self.waiting[g.request.tenant] -= 1

    def backlogged_rates(self) -> dict[str, float]:
        """Service per second while backlogged, for each tenant that was ever backlogged."""
        times = self.backlogged_time  # filled in set order, which string hashing varies from run to run
        return {t: self.backlogged_service[t] / times[t] for t in sorted(times) if times[t] > 0}


def fairness_summary(metrics: Any, service: TenantService | None = None) -> dict:
    """Per-tenant requests, finished, service and backlogged rate; Jain's index; the max service gap.

    ``metrics``: the records, a list of ``RequestMetrics`` or columns; tenants in order of first appearance."""
    metrics = as_columns(metrics)
    tenant = metrics.column("tenant")
    finished = {
        c["values"]: c["counts"] for c in pc.value_counts(pc.filter(tenant, pa.array(done_mask(metrics)))).to_pylist()
    }
    per: dict[str, dict] = {
        c["values"]: {"requests": c["counts"], "finished": finished.get(c["values"], 0)}
        for c in pc.value_counts(tenant).to_pylist()
    }
    tracked = service is not None and len(service.tenants) > 1
    rates = service.backlogged_rates() if tracked else {}
    for name, t in per.items():
        t["service"] = service.service.get(name, 0.0) if tracked else None
        t["backlogged_s"] = service.backlogged_time.get(name, 0.0) if tracked else None
        t["backlogged_service_rate"] = rates.get(name)
    return {
        "tenants": per,
        "jain_index": jain_index(list(rates.values())) if len(rates) > 1 else 1.0,
        "max_service_gap": service.max_gap if tracked else 0.0,
        "max_service_gap_time_s": service.max_gap_time if tracked else None,
    }
