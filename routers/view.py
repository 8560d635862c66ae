"""What a router's hooks see: the request and each replica, through read-only windows valid for one call.

Counts and KV usage come from the replica's step reports (as vLLM's scheduler stats do), the latest
one at least ``staleness`` seconds old; in-flight counts are the router's own bookkeeping (fresh);
prefix-cache hits are read from the replica's real cache.

A view holds no reference to what it shows: only its call's number (and its place, its replica's
name, its router's name), in a hidden slot. What it shows is found through the calls under way
(``_OPEN``), which nothing a router is handed leads to; a call leaves them when it returns, so a
view kept past its call shows nothing. A hidden slot alone would not do: a router can switch an
object's ``__class__`` to a class of its own with the same ``__slots__`` and read the slot through
that class's descriptor (``tests/test_routers.py``); here it would find only those numbers and names.
"""

from __future__ import annotations

from itertools import count
from typing import TYPE_CHECKING, NamedTuple

from kvsched.core.request import Request
from kvsched.core.view import UNKNOWABLE, frozen
from kvsched.errors import quote

if TYPE_CHECKING:
    from collections.abc import Sequence

    from kvsched.routers.plugins import RouterError
    from kvsched.routers.replica import RoutedReplica

FIELDS = tuple(
    f for f in Request.model_fields if f not in UNKNOWABLE
)  # what a RequestView shows: not the answer's length


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
    """One hook call: its number, when it runs, the staleness of the reports it shows, whether it may
    read only reports (a router that declares ``reads_reports_only``, routed ahead), the hook, the
    request and replicas it shows, the views it handed out, and the first read it refused (raised at
    the call's end even if the router caught it). Open from ``begin`` to ``end``."""

    __slots__ = (
        "number",
        "now",
        "as_of",
        "router",
        "reports_only",
        "hook",
        "refused",
        "request",
        "replicas",
        "views",
        "signals",
        "_hashes",
    )

    def __init__(
        self,
        now: float,
        staleness: float,
        router: str,
        reports_only: bool = False,
        hook: str | None = None,
        request: Request | None = None,
        replicas: Sequence[RoutedReplica] = (),
    ) -> None:
        # One slot a statement: a tuple's assignment packs and unpacks one (a call per request routed).
        self.number = next(_NUMBERS)
        self.now = now
        self.as_of = now - staleness
        self.router = router
        self.reports_only = reports_only
        self.hook = hook
        self.refused = None
        self.request = request
        self.replicas = replicas
        self.views: tuple[ReplicaView, ...] = ()
        self.signals: list[Signals | None] = [None] * len(replicas)  # each replica's report, once a view has read it
        # (id, block size) -> (request, hashes), made on the first ask (a prefix router's): most calls ask none
        self._hashes: dict[tuple[int, int], tuple[object, list[int]]] | None = None

    def begin(self) -> tuple[RequestView, tuple[ReplicaView, ...]]:
        """Open the call: the request's view and a view of each replica, in order (made without
        ``__init__``: one a replica a request)."""
        _OPEN[self.number] = self
        new, put, number, router = object.__new__, _set_at, self.number, self.router
        views = []
        for i, replica in enumerate(self.replicas):
            view = new(ReplicaView)
            put(view, (number, i, replica.name, router))
            views.append(view)
        self.views = tuple(views)
        request = new(RequestView)
        _set_request_at(request, (number, router))
        return request, self.views

    def end(self) -> None:
        del _OPEN[self.number]

    @property
    def open(self) -> bool:
        return self.number in _OPEN

    def hashes(self, request: Request, block_size: int) -> list[int]:
        """The request's full-block prefix hashes, computed once per call and block size."""
        from kvsched.routers.prefix_index import prefix_hashes

        key = (id(request), block_size)
        if self._hashes is None:
            self._hashes = {}
        found = self._hashes.get(key)
        if found is None or found[0] is not request:
            found = self._hashes[key] = (request, prefix_hashes(request.prompt_token_ids, block_size))
        return found[1]

    def refuse(self, message: str) -> RouterError:
        """The ``RouterError`` for a read this call may not make (kept as the call's, if it is still open)."""
        from kvsched.routers.plugins import RouterError

        error = RouterError(self.router, message, self.hook if self.open else None)
        if self.open and self.refused is None:
            self.refused = error
        return error


_OPEN: dict[int, RoutingCall] = {}  # the calls under way, by number
_NUMBERS = count()


def _closed(what: str, router: str) -> RouterError:
    from kvsched.routers.plugins import RouterError

    return RouterError(
        router, f"read a {what} after its call returned: a view is valid only during the call that received it"
    )


def _call_of(view: ReplicaView) -> tuple[RoutingCall, int]:
    """The open call of ``view``, and its place in it."""
    number, index, _, router = _at_of(view)
    call = _OPEN.get(number)
    if call is None:
        raise _closed("ReplicaView", router)
    return call, index


def _reported_field(i: int | None, doc: str) -> property:
    """A field of the report a view shows (``None``: the whole report): looked up on the view's first
    read, no call more after (``_call_of`` inlined: this runs for every replica of every request)."""

    def get(view: ReplicaView):
        number, index, _, router = _at_of(view)
        call = _OPEN.get(number)
        if call is None:
            raise _closed("ReplicaView", router)
        signals = call.signals[index]
        if signals is None:
            signals = call.signals[index] = call.replicas[index].signals_as_of(call.as_of)
        return signals if i is None else signals[i]

    return property(get, doc=doc)


def _replica_field(read, doc: str) -> property:
    """What ``read`` reads of the replica itself (its role, its policy, ...), while the call is open."""

    def get(view: ReplicaView):
        call, index = _call_of(view)
        return read(call.replicas[index])

    return property(get, doc=doc)


def _fresh(view: ReplicaView, name: str):
    """The replica, for a fresh signal: refused to a router that declared it reads only reports (it is
    routed ahead of them)."""
    call, index = _call_of(view)
    if call.reports_only:
        raise call.refuse(
            f"declares reads_reports_only but read {name}, which is fresh: "
            "drop the declaration, or read only reported fields"
        )
    return call.replicas[index]


def hidden_slot(cls: type, name: str):
    """Take slot ``name`` off ``cls``'s attributes; return its (getter, setter). It keeps what it holds from a read
    of the attribute, not from a class of the same layout: only what a router may hold (numbers, names) goes in one."""
    slot = cls.__dict__[name]
    delattr(cls, name)
    return slot.__get__, slot.__set__


class ReplicaView:
    """One replica as a router sees it during one call. Every attribute is read-only; ``name`` and
    ``index`` say which replica (they stay readable), the rest is refused once the call returns."""

    __slots__ = ("_at",)

    index = property(lambda self: _at_of(self)[1], doc="its place among the replicas of this call")
    name = property(lambda self: _at_of(self)[2], doc="the replica's name (replica-0, prefill-1, ...)")
    role = _replica_field(lambda r: r.role, "mixed, prefill or decode")
    profile = _replica_field(lambda r: r.profile_name, "its cost profile")
    num_gpu_blocks = _replica_field(lambda r: r.num_gpu_blocks, "its KV blocks")
    policy = _replica_field(lambda r: r.policy_name, "its scheduling policy")
    block_size = _replica_field(lambda r: r.block_size, "tokens per KV block")
    # The reads every router makes for every replica of every request (one call each, not two).
    reported_at = _reported_field(0, "when the report it shows was true (engine seconds)")
    num_waiting = _reported_field(1, "waiting requests, as reported")
    num_running = _reported_field(2, "running requests, as reported")
    num_swapped = _reported_field(3, "swapped requests, as reported")
    num_free_gpu_blocks = _reported_field(4, "free GPU blocks, as reported")
    report = _reported_field(
        None,
        "the whole report those fields come from, a read-only ``Signals(time, num_waiting, "
        "num_running, num_swapped, num_free_gpu_blocks)``: one read for a router that reads several",
    )
    in_flight_requests = property(
        lambda self: _fresh(self, "in_flight_requests").in_flight_requests,
        doc="requests the router sent it that have not finished (its own count: fresh)",
    )
    in_flight_tokens = property(
        lambda self: _fresh(self, "in_flight_tokens").in_flight_tokens, doc="prompt tokens of those requests (fresh)"
    )
    in_prefill_requests = property(
        lambda self: _fresh(self, "in_prefill_requests").in_prefill().requests,
        doc="of those, the requests whose first token has not come back: queued or in "
        "prefill (fresh: the router sees each response's first token)",
    )
    in_prefill_tokens = property(
        lambda self: _fresh(self, "in_prefill_tokens").in_prefill().tokens,
        doc="prompt tokens of those requests (fresh)",
    )

    @property
    def kv_usage(self) -> float:
        """Used GPU blocks over all of them, as reported (0 to 1; cached free blocks count as free)."""
        return 1.0 - self.num_free_gpu_blocks / self.num_gpu_blocks

    def cached_prefix_tokens(self, request: Request) -> int:
        """Leading prompt tokens of ``request`` (in full blocks) that the replica's GPU prefix cache
        holds now; 0 without prefix caching or without prompt token ids."""
        replica = _fresh(self, "cached_prefix_tokens")
        block_size = replica.block_size
        return replica.cached_prefix_blocks(_call_of(self)[0].hashes(request, block_size)) * block_size

    def __repr__(self) -> str:
        try:
            return f"<ReplicaView {_at_of(self)[2]}>"
        except (AttributeError, TypeError, IndexError):
            return "<ReplicaView not made by the cluster>"


_at_of, _set_at = hidden_slot(ReplicaView, "_at")  # (call number, place, replica name, router name)


class RequestView:
    """A request as a router's hooks see it during one call: the request's fields, read-only,
    ``sampling`` as a read-only copy (``frozen``). The engine's own request is never handed to a
    router: a frozen pydantic object is still writable through ``__dict__`` or ``object.__setattr__``
    (a router that set ``output_len`` through it once changed the run)."""

    __slots__ = ("_at",)

    sampling = property(lambda self: frozen(_request(self).sampling), doc="how it samples (a read-only copy)")

    def __repr__(self) -> str:
        try:
            return f"<RequestView {_request(self).request_id!r}>"
        except Exception:
            return "<RequestView of a call that returned>"


_request_at, _set_request_at = hidden_slot(RequestView, "_at")  # (call number, router name)


def _request(view: RequestView) -> Request:
    number, router = _request_at(view)
    call = _OPEN.get(number)
    if call is None:
        raise _closed("RequestView", router)
    return call.request


def _request_field(name: str) -> property:
    return property(lambda view: getattr(_request(view), name), doc=f"the request's {name}")


for _name in FIELDS:
    if _name != "sampling":
        setattr(RequestView, _name, _request_field(_name))


def chosen(answer: object, call: RoutingCall) -> tuple[object, str]:
    """``(replica, "")``: the replica behind ``answer`` if it is a view the cluster made for ``call``;
    else ``(None, what it is instead)``: nothing, a foreign object, a view kept from an earlier call
    (another pool's included), or a view the cluster did not make (a copy, one made by hand).
    Identity only: nothing of ``answer``'s own runs."""
    if type(answer) is not ReplicaView:
        return None, "None" if answer is None else f"{quote(answer)}, not one of the ReplicaViews it was given,"
    views = call.views
    if answer in views:  # a tuple of ReplicaViews, which compare by identity
        return call.replicas[views.index(answer)], ""
    try:
        at = _at_of(answer)
    except AttributeError:  # made without its state: ReplicaView.__new__, copy.copy
        at = None
    if type(at) is tuple and len(at) == 4 and type(at[0]) is int and at[0] < call.number:
        return None, "a view kept from an earlier call"
    return None, "a ReplicaView the cluster did not make (a copy, or one made by hand)"
