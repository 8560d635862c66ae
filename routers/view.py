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
    """One hook call: when it runs, the staleness of the reports it shows, and whether it is still open."""

    __slots__ = ("now", "as_of", "router", "open", "_hashes")

    def __init__(self, now: float, staleness: float, router: str) -> None:
        self.now, self.as_of, self.router, self.open = now, now - staleness, router, True
        self._hashes: dict[tuple[int, int], list[int]] = {}  # (id of request, block size) -> prefix hashes

    def hashes(self, request: Request, block_size: int) -> list[int]:
        """The request's full-block prefix hashes, computed once per call and block size."""
        from kvsched.routers.prefix_index import prefix_hashes

        key = (id(request), block_size)
        found = self._hashes.get(key)
        if found is None:
            found = self._hashes[key] = prefix_hashes(request.prompt_token_ids, block_size)
        return found


class ReplicaView:
    """One replica as a router sees it during one call. Every attribute is read-only."""

    __slots__ = ("_replica", "_call", "index", "_signals")

    def __init__(self, replica, call: RoutingCall, index: int) -> None:
        _set_replica(self, replica)
        self._call, self.index, self._signals = call, index, None

    def _open(self):
        call = self._call
        if not call.open:
            from kvsched.routers.plugins import RouterError

            raise RouterError(call.router, "read a ReplicaView after its call returned: a view is valid only during the call that received it")
        return _replica_of(self)

    def _reported(self) -> Signals:
        if self._signals is None:
            self._signals = self._open().signals_as_of(self._call.as_of)
        elif not self._call.open:
            self._open()
        return self._signals

    name = property(lambda self: self._open().name, doc="the replica's name (replica-0, prefill-1, ...)")
    role = property(lambda self: self._open().role, doc="mixed, prefill or decode")
    policy = property(lambda self: self._open().engine.policy_name, doc="its scheduling policy")
    profile = property(lambda self: self._open().profile_name, doc="its cost profile")
    block_size = property(lambda self: self._open().engine.config.block_size)
    num_gpu_blocks = property(lambda self: self._open().engine.config.num_gpu_blocks)
    reported_at = property(lambda self: self._reported().time, doc="when the report it shows was true (engine seconds)")
    num_waiting = property(lambda self: self._reported().num_waiting, doc="waiting requests, as reported")
    num_running = property(lambda self: self._reported().num_running, doc="running requests, as reported")
    num_swapped = property(lambda self: self._reported().num_swapped, doc="swapped requests, as reported")
    num_free_gpu_blocks = property(lambda self: self._reported().num_free_gpu_blocks, doc="free GPU blocks, as reported")
    in_flight_requests = property(lambda self: self._open().in_flight_requests, doc="requests the router sent it that have not finished (fresh)")
    in_flight_tokens = property(lambda self: self._open().in_flight_tokens, doc="prompt tokens of those requests (fresh)")

    @property
    def kv_usage(self) -> float:
        """Used GPU blocks over all of them, as reported (0 to 1; cached free blocks count as free)."""
        total = self.num_gpu_blocks
        return 1.0 - self._reported().num_free_gpu_blocks / total

    def cached_prefix_tokens(self, request: Request) -> int:
        """Leading prompt tokens of ``request`` (in full blocks) that the replica's GPU prefix cache
        holds now; 0 without prefix caching or without prompt token ids."""
        replica = self._open()
        return replica.cached_prefix_blocks(self._call.hashes(request, replica.engine.config.block_size)) * replica.engine.config.block_size

    def __repr__(self) -> str:
        return f"<ReplicaView {self._open().name}>"


_replica_of, _set_replica = hidden_slot(ReplicaView, "_replica")
