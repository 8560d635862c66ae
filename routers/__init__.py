"""Routing policies: which replica of a fleet serves each request (entry-point group ``kvsched.routers``)."""

from kvsched.routers.hookspecs import hookimpl
from kvsched.routers.plugins import RouterError, RouterHooks, UnknownRouterError, available_routers, load_router
from kvsched.routers.view import ReplicaView, Route

__all__ = [
    "hookimpl",
    "ReplicaView",
    "Route",
    "RouterError",
    "RouterHooks",
    "UnknownRouterError",
    "available_routers",
    "load_router",
]
