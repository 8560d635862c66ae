"""The hooks a routing policy implements (pluggy project ``kvsched.routers``).

A router is a plugin like a scheduling policy, in its own entry-point group (``kvsched.routers``)
and its own plugin manager, so that the engine's four hooks stay as they are. It chooses, for each
request, one replica of a fleet from read-only ``ReplicaView``s that show each replica as the
router would see it: counts and KV usage reported a configurable staleness ago, router-local
in-flight counts (fresh), and the replica's prefix cache. Routers decide; the cluster enforces: a
choice that is not one of the replicas given in the call, None, or an exception is a
``RouterError`` naming the router, and the request is never lost or sent twice.

A router whose choices depend only on reported fields, its own past choices and fixed attributes
may declare ``reads_reports_only = True``: the cluster then routes it ahead of the replicas (as
far as the staleness allows) and its views refuse the fresh signals (docs/cluster.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from kvsched.core.request import Request
    from kvsched.routers.view import ReplicaView, Route

PROJECT = "kvsched.routers"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec(firstresult=True)
def route_request(request: Request, replicas: tuple[ReplicaView, ...]) -> ReplicaView | Route | None:
    """Choose the replica for ``request`` among ``replicas`` (a tuple of views, in fleet order).

    Return one of the views, or ``Route(view, reason)`` to say why (``engine explain`` shows it).
    Called once per request at its arrival time (under P/D disaggregation, once in the prefill
    pool at arrival and once in the decode pool when its prefill is done). ``request`` is a read-only
    ``RequestView`` of it; it and the replica views are valid only during this call. Required.
    """


@hookspec
def on_routed(request: Request, replica: ReplicaView) -> None:
    """Observe the choice just made (a router-side index learns what it sent where). Optional."""


@hookspec
def on_finished(request: Request, replica: ReplicaView) -> None:
    """Observe that ``request`` finished on ``replica`` (a router learns it when the response ends). Optional."""
