"""Finding, loading and calling routers (entry-point group ``kvsched.routers``), as core/plugins.py
does for scheduling policies, with its own plugin manager and three hooks.

``RouterHooks`` validates every choice: a router that returns None, something that is not a
replica view, or a view it was not given in this call (a foreign pool's, or one kept from an
earlier call), or that raises, gets a ``RouterError`` naming the router, the hook and its line.
"""

from __future__ import annotations

import inspect
from itertools import repeat
import traceback
import typing
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

import pluggy
from pydantic import TypeAdapter, ValidationError

from kvsched.core.errors import PolicyError, UnknownPolicyError, quote, shorten
from kvsched.core.plugins import _dispatch, _load_target, _plugin_line, describe
from kvsched.routers import hookspecs
from kvsched.routers.view import ReplicaView, Route, RoutingCall, _replica_of

ENTRY_POINT_GROUP = "kvsched.routers"
DEFAULT_ROUTER = "round-robin"
ROUTE, ON_ROUTED, ON_FINISHED = "route_request", "on_routed", "on_finished"


class RouterError(PolicyError):
    """A router raised, returned no replica or one it was not given, or misused a view."""

    def __init__(self, router: str, message: str, hook: str | None = None) -> None:
        super().__init__(router, message, hook, role="router")


class UnknownRouterError(UnknownPolicyError):
    """No installed router has the requested name."""


@dataclass(frozen=True)
class RouterInfo:
    """An installed router as its package metadata describes it (nothing is imported)."""

    name: str
    distribution: str
    version: str
    target: str


def available_routers() -> dict[str, RouterInfo]:
    """Every router registered under ``kvsched.routers``, by name, read from metadata only."""
    found = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist
        found.setdefault(ep.name, RouterInfo(ep.name, dist.name if dist else "?", dist.version if dist else "?", ep.value))
    return dict(sorted(found.items()))


def load_router(spec: str) -> Any:
    """The object behind ``spec``: an installed router's name, or ``path/to/file.py:Attr`` / ``module:Attr``."""
    if ":" in spec:
        try:
            return _load_target(spec)
        except UnknownPolicyError as exc:
            raise UnknownRouterError(str(exc).replace("policy", "router")) from None
        except PolicyError as exc:
            raise RouterError(spec, str(exc).split(": ", 1)[1]) from None
    matches = entry_points(group=ENTRY_POINT_GROUP, name=spec)
    if not matches:
        names = ", ".join(available_routers()) or "none installed"
        raise UnknownRouterError(f"unknown router {spec!r}; available: {names} (or path/to/file.py:Class)")
    ep = next(iter(matches))
    try:
        return ep.load()
    except Exception as exc:
        raise RouterError(spec, f"its entry point {ep.value} fails to load: {type(exc).__name__}: {shorten(str(exc))}") from exc


def router_options(router: Any, name: str, options: dict[str, Any] | None) -> dict[str, Any]:
    """``options`` (strings from the command line, or values) checked and converted against the
    router class's constructor: an unknown key or a value its annotation refuses is named."""
    if not options:
        return {}
    if not inspect.isclass(router):
        raise RouterError(name, f"options {options} given, but the router is not a class")
    params = inspect.signature(router).parameters
    try:
        hints = typing.get_type_hints(router.__init__)
    except Exception:
        hints = {}
    out = {}
    for key, value in options.items():
        if key not in params:
            raise RouterError(name, f"has no option {key!r}; its options: {', '.join(params) or 'none'}")
        try:
            out[key] = TypeAdapter(hints[key]).validate_python(value, strict=False) if key in hints else value
        except ValidationError as exc:
            raise RouterError(name, f"option {key}={quote(value)}: {exc.errors()[0]['msg']}") from None
    return out


class RouterHooks:
    """One fleet's router: loaded, instantiated (fresh per fleet), registered and called through
    validated wrappers. ``router`` is an installed router's name or a router object."""

    def __init__(self, router: str | Any = DEFAULT_ROUTER, options: dict[str, Any] | None = None) -> None:
        if isinstance(router, str):
            spec, router = router, load_router(router)
            self.name = spec if ":" not in spec else (getattr(router, "name", None) or spec.rpartition(":")[2])
        else:
            self.name = getattr(router, "name", None) or getattr(router, "__name__", type(router).__name__)
        if router is None or isinstance(router, (bool, int, float, str, bytes)):
            raise RouterError(str(self.name), f"is {quote(router)}, not a router class, instance or module")
        options = router_options(router, self.name, options)
        if inspect.isclass(router):
            try:
                router = router(**options)
            except (TypeError, ValueError) as exc:
                raise RouterError(self.name, f"bad router options {options}: {exc}") from exc
        self.router = router
        self.description = describe(router)
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        try:
            self.pm.register(router, name=self.name)
            self.pm.check_pending()
        except (pluggy.PluginValidationError, ValueError) as exc:
            raise RouterError(self.name, f"invalid plugin: {exc}") from exc
        hook = self.pm.hook
        if not hook.route_request.get_hookimpls():
            raise RouterError(self.name, "implements no route_request: mark it with @kvsched.routers.hookimpl")
        self._route = _dispatch(hook.route_request, ("request", "replicas"))
        self._on_routed = _dispatch(hook.on_routed, ("request", "replica"), False) if hook.on_routed.get_hookimpls() else None
        self._on_finished = _dispatch(hook.on_finished, ("request", "replica"), False) if hook.on_finished.get_hookimpls() else None
        # A router whose choices depend on nothing but stale reports, its own past choices and fixed
        # attributes may be routed ahead of the replicas (cluster/loop.py); its views refuse fresh reads.
        self.reads_reports_only = getattr(router, "reads_reports_only", False) is True
        if self.reads_reports_only and self._on_finished is not None:
            raise RouterError(self.name, "declares reads_reports_only and implements on_finished: a router routed ahead "
                                         "learns of finishes after later choices; drop one of the two")

    def route(self, request, replicas: list, now: float, staleness: float, reports_only: bool = False) -> tuple[Any, str]:
        """Ask the router for ``request`` among ``replicas`` (the cluster's ``Replica`` objects) at ``now``;
        the chosen replica and the router's reason. Views show reports at least ``staleness`` old, and
        only those if ``reports_only``."""
        call = RoutingCall(now, staleness, self.name, reports_only)
        views = tuple(map(ReplicaView, replicas, repeat(call), range(len(replicas))))
        try:
            answer = self._call(ROUTE, self._route, request, views)
        finally:
            call.open = False
        reason = ""
        if isinstance(answer, Route):
            answer, reason = answer.replica, answer.reason
            if not isinstance(reason, str):
                raise RouterError(self.name, f"gave the reason {quote(reason)}, not a string", ROUTE)
        if answer is None:
            raise RouterError(self.name, f"returned None for request {request.request_id!r}: return one of the replicas it was given", ROUTE)
        if not isinstance(answer, ReplicaView):
            raise RouterError(self.name, f"returned {quote(answer)}, not one of the ReplicaViews it was given", ROUTE)
        if answer._call is not call:
            raise RouterError(self.name, f"returned {'a view kept from an earlier call' if not answer._call.open else 'a view it was not given'}"
                              f" for request {request.request_id!r}: return one of the replicas given in this call", ROUTE)
        return _replica_of(answer), reason

    def routed(self, request, replica, now: float, staleness: float = 0.0, reports_only: bool = False) -> None:
        if self._on_routed is not None:
            self._notify(ON_ROUTED, self._on_routed, request, replica, RoutingCall(now, staleness, self.name, reports_only))

    def finished(self, request, replica, now: float, staleness: float = 0.0) -> None:
        if self._on_finished is not None:
            self._notify(ON_FINISHED, self._on_finished, request, replica, RoutingCall(now, staleness, self.name))

    def _notify(self, name: str, hook, request, replica, call: RoutingCall) -> None:
        """An observing hook's call: its view as stale as a routing call's (the router knows no more then)."""
        try:
            self._call(name, hook, request, ReplicaView(replica, call, 0))
        finally:
            call.open = False

    def _call(self, name: str, hook, *args):
        try:
            return hook(*args)
        except RouterError:
            raise
        except Exception as exc:
            frames = list(traceback.walk_tb(exc.__traceback__))[::-1]
            raise RouterError(self.name, f"raised {type(exc).__name__}: {shorten(str(exc))}{_plugin_line(frames)}", name) from exc
