"""What a router sees of one replica: a read-only window, as of a stale report, valid for one call.

Counts and KV usage come from the replica's step reports (as vLLM's scheduler stats do), the latest
one at least ``staleness`` seconds old; in-flight counts are the router's own bookkeeping (fresh);
prefix-cache hits are read from the replica's real cache. The view keeps its replica and its call
in a hidden slot (no attribute leads to them, and a copy of the view does not carry them) and
refuses every read once its call has returned, so a router can neither reach the cluster through
one nor keep one and act on what it no longer shows.
"""

from __future__ import annotations

from operator import attrgetter
from typing import TYPE_CHECKING, NamedTuple

from kvsched.core.errors import quote
from kvsched.core.request import Request
from kvsched.core.view import frozen, hidden_slot

if TYPE_CHECKING:
    from kvsched.routers.plugins import RouterError

FIELDS = tuple(Request.model_fields)  # what a RequestView shows


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


class RequestView:
    """A request as a router's hooks see it: the request's fields, read-only, ``sampling`` as a read-only
    copy (``frozen``). The engine's own request is in a hidden slot: a frozen pydantic object is still
    writable through ``__dict__`` or ``object.__setattr__``, so it is never handed to a router (one
    that set ``output_len`` through it once changed the run)."""

    __slots__ = ("_request",)

    def __init__(self, request: Request) -> None:
        _set_request(self, request)

    sampling = property(lambda self: frozen(_request_of(self).sampling), doc="how it samples (a read-only copy)")

    def __repr__(self) -> str:
        return f"<RequestView {_request_of(self).request_id!r}>"


_request_of, _set_request = hidden_slot(RequestView, "_request")


def _request_field(name: str) -> property:
    return property(lambda view: getattr(_request_of(view), name), doc=f"the request's {name}")


for _name in FIELDS:
    if _name != "sampling":
        setattr(RequestView, _name, _request_field(_name))


class RoutingCall:
    """One hook call: when it runs, the staleness of the reports it shows, whether it is still open,
    whether it may read only reports (a router that declares ``reads_reports_only``, routed ahead),
    the hook, and the first read it refused (raised at the call's end even if the router caught it)."""

    __slots__ = ("now", "as_of", "router", "open", "reports_only", "hook", "refused", "_hashes")

    def __init__(self, now: float, staleness: float, router: str, reports_only: bool = False,
                 hook: str | None = None) -> None:
        self.now, self.as_of, self.router, self.open, self.reports_only = now, now - staleness, router, True, reports_only
        self.hook, self.refused = hook, None
        self._hashes: dict[tuple[int, int], tuple[object, list[int]]] = {}  # (id, block size) -> (request, hashes)

    def hashes(self, request: Request, block_size: int) -> list[int]:
        """The request's full-block prefix hashes, computed once per call and block size."""
        from kvsched.routers.prefix_index import prefix_hashes

        key = (id(request), block_size)
        found = self._hashes.get(key)
        if found is None or found[0] is not request:
            found = self._hashes[key] = (request, prefix_hashes(request.prompt_token_ids, block_size))
        return found[1]

    def refuse(self, message: str):
        """The ``RouterError`` for a read this call may not make (kept as the call's, if it is still open)."""
        from kvsched.routers.plugins import RouterError

        error = RouterError(self.router, message, self.hook if self.open else None)
        if self.open and self.refused is None:
            self.refused = error
        return error


_REPLICA, _CALL, _INDEX, _SIGNALS = range(4)  # a view's state: [replica, call, index, report read (None until read)]


def _closed(call: RoutingCall) -> RouterError:
    return call.refuse("read a ReplicaView after its call returned: "
                       "a view is valid only during the call that received it")


def _live(view: ReplicaView) -> list:
    """The view's state while its call is open."""
    state = _state_of(view)
    if not state[_CALL].open:
        raise _closed(state[_CALL])
    return state


def _reported_field(i: int | None, doc: str) -> property:
    """A field of the report a view shows (``None``: the whole report): looked up on the view's first
    read, no call more after (``_live`` inlined: these are read for every replica of every request)."""

    def get(view: ReplicaView):
        state = _state_of(view)
        call = state[1]  # _CALL, as a constant: this runs for every replica of every request
        if not call.open:
            raise _closed(call)
        signals = state[3]  # _SIGNALS
        if signals is None:
            signals = state[3] = state[0].signals_as_of(call.as_of)  # _REPLICA's
        return signals if i is None else signals[i]

    return property(get, doc=doc)


def _replica_field(name: str, doc: str) -> property:
    """An attribute of the replica itself (its name, role, ...), read while the call is open."""
    read = attrgetter(name)

    def get(view: ReplicaView):
        state = _state_of(view)
        if not state[1].open:  # _CALL's (a constant, as above)
            raise _closed(state[1])
        return read(state[0])  # _REPLICA

    return property(get, doc=doc)


def _fresh(view: ReplicaView, name: str):
    """The replica, for a fresh signal: refused to a router that declared it reads only reports (it is
    routed ahead of them)."""
    state = _live(view)
    if state[_CALL].reports_only:
        raise state[_CALL].refuse(f"declares reads_reports_only but read {name}, which is fresh: "
                                  "drop the declaration, or read only reported fields")
    return state[_REPLICA]


class ReplicaView:
    """One replica as a router sees it during one call. Every attribute is read-only, and none leads
    to the replica, the call or anything else of the cluster's: what the view shows is in one hidden
    slot (``hidden_slot``), which a copy of the view does not carry."""

    __slots__ = ("_state",)

    def __init__(self, replica, call: RoutingCall, index: int) -> None:
        _set_state(self, [replica, call, index, None])

    index = property(lambda self: _state_of(self)[_INDEX], doc="its place among the replicas of this call")
    name = _replica_field("name", "the replica's name (replica-0, prefill-1, ...)")
    role = _replica_field("role", "mixed, prefill or decode")
    profile = _replica_field("profile_name", "its cost profile")
    num_gpu_blocks = _replica_field("num_gpu_blocks", "its KV blocks")
    policy = property(lambda self: _live(self)[_REPLICA].engine.policy_name, doc="its scheduling policy")
    block_size = property(lambda self: _live(self)[_REPLICA].engine.config.block_size, doc="tokens per KV block")
    # The reads every router makes for every replica of every request (one call each, not two).
    reported_at = _reported_field(0, "when the report it shows was true (engine seconds)")
    num_waiting = _reported_field(1, "waiting requests, as reported")
    num_running = _reported_field(2, "running requests, as reported")
    num_swapped = _reported_field(3, "swapped requests, as reported")
    num_free_gpu_blocks = _reported_field(4, "free GPU blocks, as reported")
    report = _reported_field(None, "the whole report those fields come from, a read-only ``Signals(time, num_waiting, "
                                   "num_running, num_swapped, num_free_gpu_blocks)``: one read for a router that reads several")
    in_flight_requests = property(lambda self: _fresh(self, "in_flight_requests").in_flight_requests,
                                  doc="requests the router sent it that have not finished (its own count: fresh)")
    in_flight_tokens = property(lambda self: _fresh(self, "in_flight_tokens").in_flight_tokens,
                                doc="prompt tokens of those requests (fresh)")

    @property
    def kv_usage(self) -> float:
        """Used GPU blocks over all of them, as reported (0 to 1; cached free blocks count as free)."""
        return 1.0 - self.num_free_gpu_blocks / _state_of(self)[_REPLICA].num_gpu_blocks

    def cached_prefix_tokens(self, request: Request) -> int:
        """Leading prompt tokens of ``request`` (in full blocks) that the replica's GPU prefix cache
        holds now; 0 without prefix caching or without prompt token ids."""
        replica = _fresh(self, "cached_prefix_tokens")
        block_size = replica.engine.config.block_size
        return replica.cached_prefix_blocks(_state_of(self)[_CALL].hashes(request, block_size)) * block_size

    def __repr__(self) -> str:
        try:
            return f"<ReplicaView {_state_of(self)[_REPLICA].name}>"
        except AttributeError:
            return "<ReplicaView not made by the cluster>"


_state_of, _set_state = hidden_slot(ReplicaView, "_state")


def views(replicas: list, call: RoutingCall) -> tuple[ReplicaView, ...]:
    """A view of each of ``replicas`` for ``call``, in order (made without ``__init__``: one a replica a request)."""
    new, put, out = object.__new__, _set_state, []
    for i, replica in enumerate(replicas):
        view = new(ReplicaView)
        put(view, [replica, call, i, None])
        out.append(view)
    return tuple(out)


def chosen(answer: object, call: RoutingCall) -> tuple[object, str]:
    """``(replica, "")``: the replica behind ``answer`` if it is a view the cluster made for ``call``;
    else ``(None, what it is instead)``: nothing, a foreign object, a view kept from an earlier call
    (another pool's included), one made by hand, or a copy."""
    if type(answer) is not ReplicaView:
        return None, "None" if answer is None else f"{quote(answer)}, not one of the ReplicaViews it was given,"
    try:
        state = _state_of(answer)
    except AttributeError:  # made without its state: ReplicaView.__new__, copy.copy
        return None, "a ReplicaView the cluster did not make (a copy, or one made by hand)"
    if state[_CALL] is call:
        return state[_REPLICA], ""
    return None, "a view it was not given in this call" if state[_CALL].open else "a view kept from an earlier call"
