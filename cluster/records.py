"""What a fleet run measured, request by request: each request's timeline across the replicas that
served it (one, or a prefill and a decode replica), where the router sent it and why.

Rows are ``RequestMetrics``' fields in order (what ``metrics.requests.summarize`` reads) with three columns more
(``EXTRA``): the replica that finished the request, the one that ran its prompt, and the prompt tokens its first
admission found in that replica's prefix cache; read them by name as ``FleetRow``s (``named_rows()``). They are kept
as a single run's are (``metrics/records.py``'s ``Recorder``), in the order the requests arrived at the fleet.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, NamedTuple

import pyarrow as pa

from kvsched.core.request import Request
from kvsched.metrics.records import SCHEMA, Recorder, row_of
from kvsched.metrics.requests import FIELDS, RequestMetrics, request_row  # noqa: F401  (FIELDS: for benchmarks/, run on old commits)

if TYPE_CHECKING:
    from kvsched.cluster.replica import Replica
    from kvsched.core.sequence import SequenceGroup


EXTRA = pa.schema([("replica", pa.int64()), ("prompt_replica", pa.int64()), ("cached_tokens", pa.int64())])
FLEET_SCHEMA = pa.schema([*SCHEMA, *EXTRA])  # a single run's columns, then the fleet's own
# One row, FLEET_SCHEMA's columns by name (``row.finish_time``, ``row.replica``), as ``named_rows()`` reads it.
FleetRow = namedtuple("FleetRow", FLEET_SCHEMA.names)


class RouteRecord(NamedTuple):
    """One of the router's decisions: the request, the pool it was routed into (its replica's role), when, the
    replica (its index in the fleet) and the router's reason."""

    request_id: str
    pool: str
    time: float
    replica: int
    reason: str


class PrefillPart(NamedTuple):
    """P/D: a request whose prompt the prefill pool runs, and once it has, that part's record, the replica that
    ran it and the prompt tokens its first admission found in that replica's prefix cache."""

    request: Request  # the original request, as it arrived at the fleet
    first: RequestMetrics | None  # None until the prompt ran
    replica: int  # -1 until then
    cached: int


class FleetRecords:
    """Rows of finished requests and the router's decisions, appended as the run goes."""

    def __init__(self, replicas: list[Replica]) -> None:
        self.replicas = replicas
        self.recorder = Recorder(FLEET_SCHEMA)
        self.rows = self.recorder.rows  # FLEET_SCHEMA's columns, in the order the requests arrived
        self.over = False  # the run is over: every request has its row
        self._table: pa.Table | None = None
        self.routes: list[RouteRecord] = []
        self.num_arrived = 0
        self._ids: dict[str, int] = {}  # each request id that arrived, to its place: a fleet serves each id once
        self._prefills: dict[str, PrefillPart] = {}  # P/D: by request id

    def arrived(self, request: Request) -> None:
        """``request`` arrived at the fleet: refused if its id did before (it would be recorded twice,
        and the replicas, each knowing only its own requests, cannot tell)."""
        ids = self._ids
        if request.request_id in ids:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        ids[request.request_id] = self.num_arrived
        self.num_arrived += 1

    def routed(self, request: Request, replica: Replica, t: float, reason: str) -> None:
        route = (request.request_id, replica.role, t, replica.index, reason)
        self.routes.append(tuple.__new__(RouteRecord, route))  # without its __new__'s Python frame: one a request

    def done(self, group: SequenceGroup, replica: Replica) -> None:
        """``group`` ended on ``replica``: its row (merged with its prefill's under P/D)."""
        cached = replica.cached_by_request.pop(group.index, 0)
        prefill = self._prefills.pop(group.request_id, None)
        if prefill is None:  # the row as the engine's records make it, the fleet's columns after
            i = replica.index
            self.recorder.add(self._ids[group.request_id], (*request_row(group), i, i, cached))
            return
        original, first = prefill.request, prefill.first
        m = RequestMetrics.of(group)
        output = 1 + m.output_tokens
        tpot = (
            (m.finish_time - first.first_token_time) / (output - 1)
            if m.finish_time is not None and output > 1
            else None
        )
        merged = RequestMetrics(
            request_id=m.request_id,
            status=m.status,
            finish_reason=m.finish_reason,
            detail=m.detail,
            priority=original.priority,
            tenant=original.tenant,
            n=original.sampling.n,
            prompt_tokens=original.prompt_len,
            output_tokens=output,
            arrival_time=original.arrival_time,
            first_scheduled_time=first.first_scheduled_time,
            first_token_time=first.first_token_time,
            finish_time=m.finish_time,
            queueing_time=first.queueing_time,
            ttft=first.ttft,
            tpot=tpot,
            e2e=None if m.finish_time is None else m.finish_time - original.arrival_time,
            preemptions_recompute=first.preemptions_recompute + m.preemptions_recompute,
            preemptions_swap=first.preemptions_swap + m.preemptions_swap,
            **fleet_counts(first, m, group, replica.engine.executor.received.pop(group.index, 0), cached),
            slo_class=original.slo_class,
            session_id=original.session_id,
        )
        self._append(merged, replica.index, prefill.replica, prefill.cached)

    def _append(self, m: RequestMetrics, replica: int, prompt_replica: int, cached: int) -> None:
        self.recorder.add(self._ids[m.request_id], (*row_of(m), replica, prompt_replica, cached))

    def named_rows(self) -> Iterator[FleetRow]:
        """The rows so far, each read by name. They are kept as plain tuples: the collector stops tracking a tuple of
        numbers and strings, never a namedtuple, and every full pass of a long run would walk them all."""
        return map(FleetRow._make, self.rows)

    # ------------------------------------------------------------------ P/D disaggregation
    def prefill_part(self, request: Request) -> Request:
        """What the prefill pool runs of ``request``: its prompt and first token."""
        if request.sampling.n != 1:
            from kvsched.cluster.spec import FleetError

            raise FleetError(
                f"request {request.request_id!r}: P/D disaggregation runs one sequence per request (n=1), not "
                f"n={request.sampling.n}"
            )
        self._prefills[request.request_id] = PrefillPart(request, None, -1, 0)
        if request.output_len == 1:  # its one token is all it has: it runs whole in the prefill pool
            return request
        return request.model_copy(
            update={"sampling": request.sampling.model_copy(update={"max_tokens": 1}), "output_len": None}
        )

    def prefill_done(self, group: SequenceGroup, replica: Replica) -> Request | None:
        """The prompt of ``group`` ran on ``replica``: the request for the decode pool (None if nothing
        is left to decode: its one token was all, or the prompt was ignored or aborted). A prefill part
        that goes on ends length-capped at its one token."""
        original = self._prefills[group.request_id].request
        first = RequestMetrics.of(group)
        cached = replica.cached_by_request.pop(group.index, 0)
        left = original.sampling.max_tokens - 1 if original.output_len is None else original.output_len - 1
        if first.first_token_time is None or left < 1 or group.status.name != "FINISHED_LENGTH_CAPPED":
            del self._prefills[group.request_id]
            self._append(replace(first, n=original.sampling.n), replica.index, replica.index, cached)
            return None
        self._prefills[group.request_id] = PrefillPart(original, first, replica.index, cached)
        seq = group.seqs[0]
        prompt = (
            {"prompt_token_ids": original.prompt_token_ids + (seq.output[0],)}
            if original.prompt_token_ids
            else {"prompt_len": original.prompt_len + 1}
        )
        return Request(
            request_id=original.request_id,
            **prompt,
            arrival_time=group.finish_time,
            sampling=original.sampling.model_copy(update={"max_tokens": original.sampling.max_tokens - 1}),
            output_len=None if original.output_len is None else original.output_len - 1,
            priority=original.priority,
            tenant=original.tenant,
            session_id=original.session_id,
            slo_class=original.slo_class,
        )

    def close(self) -> FleetRecords:
        """The run is over: every request has a row (``testing/cluster.py`` checks it), in ``table`` once asked."""
        self.recorder.finish()
        self.over = True
        return self

    @property
    def table(self) -> pa.Table | None:
        """The rows as a table once the run is over (None before), made when first asked: the summary's work, not
        the run's (pyarrow's first array from Python lists imports pandas, a third of a second)."""
        if self._table is None and self.over:
            self._table = self.recorder.close()
        return self._table


def fleet_counts(
    prefill: RequestMetrics, decode: RequestMetrics, group: SequenceGroup, received: int, cached: int
) -> dict:
    """A P/D request's recompute-tax counts as the fleet's (docs/cluster.md), from its prefill half's (``prefill``)
    and its decode half's (``decode``, of ``group``, which loaded ``received`` prompt tokens from the transfer and
    found ``cached`` in its prefix cache at its first admission). The decode half computed what it counts
    less what it received; of that, the positions past the prompt up to the furthest it reached are computed
    for the first time, the rest again (the prompt the prefill replica computed, or what a preemption threw
    away). A preemption by recompute before it had loaded the whole transfer throws away the rest too."""
    prompt = group.request.prompt_len - 1  # the handed-over prompt ends with the first token, computed here
    computed = decode.computed_tokens - received
    reach = max(group.recompute_frontier, group.seqs[0].num_computed_tokens)
    dropped = max(0, prompt - cached - received) if decode.preemptions_recompute else 0
    return {
        "recomputed_tokens": prefill.recomputed_tokens + computed - max(0, reach - prompt),
        "discarded_tokens": prefill.discarded_tokens + decode.discarded_tokens + dropped,
        "computed_tokens": prefill.computed_tokens + computed,
    }
