"""What a router sees of one replica: a read-only window, as of a stale report, valid for one call.

Counts and KV usage come from the replica's step reports (as vLLM's scheduler stats do), the latest
one at least ``staleness`` seconds old; in-flight counts are the router's own bookkeeping (fresh);
prefix-cache hits are read from the replica's real cache. The view keeps its replica in a hidden
slot and refuses every read once its call has returned, so a router cannot keep one and act on
what it no longer shows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from kvsched.core.view import hidden_slot

if TYPE_CHECKING:
    from kvsched.core.request import Request


class Signals(NamedTuple):
    """One report of a replica: when it was true and what it said."""

    time: float
    num_waiting: int
    num_running: int
    num_swapped: int
    num_free_gpu_blocks: int


class Route(NamedTuple):
    """A router's answer with its reason: ``Route(replica, "longest prefix match: 12 blocks")``."""

    replica: object
    reason: str = ""


class RoutingCall:
    """One hook call: when it runs, the staleness of the reports it shows, whether it is still open, and
    whether it may read only reports (a router that declares ``reads_reports_only``, routed ahead)."""

    __slots__ = ("now", "as_of", "router", "open", "reports_only", "_hashes")

    def __init__(self, now: float, staleness: float, router: str, reports_only: bool = False) -> None:
        self.now, self.as_of, self.router, self.open, self.reports_only = now, now - staleness, router, True, reports_only
        self._hashes: dict[tuple[int, int], list[int]] = {}  # (id of request, block size) -> prefix hashes

    def hashes(self, request: Request, block_size: int) -> list[int]:
        """The request's full-block prefix hashes, computed once per call and block size."""
        from kvsched.routers.prefix_index import prefix_hashes

        key = (id(request), block_size)
        found = self._hashes.get(key)
        if found is None:
            found = self._hashes[key] = prefix_hashes(request.prompt_token_ids, block_size)
        return found


def _reported_field(i: int | None, doc: str) -> property:
    """A field of the report a view shows (``None``: the whole report): looked up on the view's first
    read, no call more after."""

    def get(view: ReplicaView):
        signals, call = view._signals, view._call
        if not call.open:
            view._open()  # raises
        if signals is None:
            signals = view._signals = _replica_of(view).signals_as_of(call.as_of)
        return signals if i is None else signals[i]

    return property(get, doc=doc)


def _replica_field(name: str, doc: str) -> property:
    """An attribute of the replica itself (its name, role, ...), read while the call is open."""

    def get(view: ReplicaView):
        if view._call.open:
            return getattr(_replica_of(view), name)
        return view._open()  # raises

    return property(get, doc=doc)


class ReplicaView:
    """One replica as a router sees it during one call. Every attribute is read-only."""

    __slots__ = ("_replica", "_call", "_index", "_signals")

    def __init__(self, replica, call: RoutingCall, index: int) -> None:
        _set_replica(self, replica)
        self._call, self._index, self._signals = call, index, None

    index = property(lambda self: self._index, doc="its place among the replicas of this call")

    def _open(self):
        if not self._call.open:
            from kvsched.routers.plugins import RouterError

            raise RouterError(self._call.router, "read a ReplicaView after its call returned: a view is valid only during the call that received it")
        return _replica_of(self)

    def _fresh(self, name: str):
        """A fresh signal, refused to a router that declared it reads only reports (it is routed ahead of them)."""
        replica = self._open()
        if self._call.reports_only:
            from kvsched.routers.plugins import RouterError

            raise RouterError(self._call.router, f"declares reads_reports_only but read {name}, which is fresh: "
                                                 "drop the declaration, or read only reported fields")
        return replica

    name = _replica_field("name", "the replica's name (replica-0, prefill-1, ...)")
    role = _replica_field("role", "mixed, prefill or decode")
    policy = property(lambda self: self._open().engine.policy_name, doc="its scheduling policy")
    profile = property(lambda self: self._open().profile_name, doc="its cost profile")
    block_size = property(lambda self: self._open().engine.config.block_size)
    num_gpu_blocks = property(lambda self: self._open().engine.config.num_gpu_blocks)
    # The reads every router makes for every replica of every request (one call each, not two).
    reported_at = _reported_field(0, "when the report it shows was true (engine seconds)")
    num_waiting = _reported_field(1, "waiting requests, as reported")
    num_running = _reported_field(2, "running requests, as reported")
    num_swapped = _reported_field(3, "swapped requests, as reported")
    num_free_gpu_blocks = _reported_field(4, "free GPU blocks, as reported")
    report = _reported_field(None, "the whole report those fields come from, a read-only ``Signals(time, num_waiting, "
                                   "num_running, num_swapped, num_free_gpu_blocks)``: one read for a router that reads several")

    @property
    def in_flight_requests(self) -> int:
        """Requests the router sent it that have not finished (its own count: fresh)."""
        call = self._call
        if call.open and not call.reports_only:
            return _replica_of(self).in_flight_requests
        return self._fresh("in_flight_requests").in_flight_requests

    @property
    def in_flight_tokens(self) -> int:
        """Prompt tokens of those requests (fresh)."""
        call = self._call
        if call.open and not call.reports_only:
            return _replica_of(self).in_flight_tokens
        return self._fresh("in_flight_tokens").in_flight_tokens

    @property
    def kv_usage(self) -> float:
        """Used GPU blocks over all of them, as reported (0 to 1; cached free blocks count as free)."""
        return 1.0 - self.num_free_gpu_blocks / _replica_of(self).num_gpu_blocks

    def cached_prefix_tokens(self, request: Request) -> int:
        """Leading prompt tokens of ``request`` (in full blocks) that the replica's GPU prefix cache
        holds now; 0 without prefix caching or without prompt token ids."""
        replica = self._fresh("cached_prefix_tokens")
        return replica.cached_prefix_blocks(self._call.hashes(request, replica.engine.config.block_size)) * replica.engine.config.block_size

    def __repr__(self) -> str:
        return f"<ReplicaView {self._open().name}>"


_replica_of, _set_replica = hidden_slot(ReplicaView, "_replica")
