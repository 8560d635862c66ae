"""Finding, loading and calling routers (entry-point group ``kvsched.routers``).

A router is loaded by the plugin layer policies are loaded by (``kvsched/plugins/``, plugins of kind ``router``):
whatever its import, attributes, constructor or hook markers raise, SystemExit included, is one
``RouterError`` naming it and where it comes from, and a name that two distributions register is
refused until one is chosen as ``DIST:NAME``. ``RouterHooks`` calls it with its own plugin manager
and three hooks, hands it read-only views of each request and of the replicas, with no path to what they show, and
validates every answer: a router that returns None, something that is not a replica view, or a
view it was not given in this call (a foreign pool's, one kept from an earlier call, a copy), a
reason that cannot be recorded, or that raises anything, gets a ``RouterError`` naming the router,
the hook and its line.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

from kvsched.core.decisions import held_problem
from kvsched.errors import PolicyError, UnknownPolicyError, quote
from kvsched.plugins.boundary import call_hook, exception_text
from kvsched.plugins.discovery import (
    GROUPS,
    PolicyInfo,
    available_policies,
    installed_policies,
    load_policy,
    resolve_plugin,
)
from kvsched.plugins.hooks import dispatch, plugin_manager
from kvsched.plugins.identity import describe, policy_attribute
from kvsched.plugins.options import checked_options, instantiate
from kvsched.routers import hookspecs, view
from kvsched.routers.view import Route, RoutingCall, chosen

KIND = "router"
ENTRY_POINT_GROUP = GROUPS[KIND]
DEFAULT_ROUTER = "round-robin"
ROUTE, ON_ROUTED, ON_FINISHED = "route_request", "on_routed", "on_finished"
_OWN_FILES = (view.__file__, __file__)  # the cluster's side of a hook call: an error's line is the router's, not these


class RouterError(PolicyError):
    """A router raised, returned no replica or one it was not given, or misused a view."""

    def __init__(self, router: str, message: str, hook: str | None = None) -> None:
        super().__init__(router, message, hook, role="router")


class UnknownRouterError(UnknownPolicyError):
    """No installed router has the requested name."""


@contextmanager
def said_of_a_router() -> Iterator[None]:
    """What the policies' loading raises while it loads a router, said of the router."""
    try:
        yield
    except RouterError:
        raise
    except UnknownPolicyError as exc:
        raise UnknownRouterError(str(exc)) from None
    except PolicyError as exc:
        raise RouterError(exc.policy, exc.message, exc.hook) from exc.__cause__


def installed_routers() -> list[PolicyInfo]:
    """Every router registered under ``kvsched.routers`` by (name, distribution), read from metadata only."""
    return installed_policies(KIND)


def available_routers() -> dict[str, PolicyInfo]:
    """Every installed router by the spec that chooses it: its name, or ``DIST:NAME`` where several
    distributions register the name."""
    return available_policies(KIND)


def load_router(spec: str) -> Any:
    """The object behind ``spec``: an installed router's name (``DIST:NAME`` where the name is
    ambiguous), or ``path/to/file.py:Attr`` / ``module:Attr``."""
    with said_of_a_router():
        return load_policy(spec, KIND)


def describe_router(spec: str) -> str:
    """The first line of the docstring of the router ``spec`` (what ``engine routers`` prints)."""
    with said_of_a_router():
        return describe(load_policy(spec, KIND))


def _unrecordable(reason: object) -> str | None:
    """What keeps a router's reason out of ``routes.csv`` or off a terminal (None: nothing): what keeps a
    policy's ``hold_back`` reason out of its decision log, or more than one printable line."""
    problem = held_problem(reason, {})
    if problem is None and not reason.isprintable():
        return "the reason must be one printable line (no line break or control character)"
    return problem


class RouterHooks:
    """One fleet's router: loaded, instantiated (fresh per fleet), registered and called through
    validated wrappers. ``router`` is an installed router's name or a router object."""

    def __init__(self, router: str | Any = DEFAULT_ROUTER, options: dict[str, Any] | None = None) -> None:
        with said_of_a_router():
            router, self.name, _ = resolve_plugin(router, KIND)
            router = self.router = instantiate(router, checked_options(router, options, self.name, KIND), self.name)
            self.description = describe(router)
            self.pm = plugin_manager(hookspecs.PROJECT, hookspecs, [(router, self.name)], self._invalid)
            # A router whose choices depend on nothing but stale reports, its own past choices and fixed
            # attributes may be routed ahead of the replicas (cluster/loop.py); its views refuse fresh reads.
            self.reads_reports_only = policy_attribute(router, "reads_reports_only", False, self.name) is True
        hook = self.pm.hook
        if not hook.route_request.get_hookimpls():
            raise RouterError(self.name, "implements no route_request: mark it with @kvsched.routers.hookimpl")
        self._route = dispatch(hook.route_request, ("request", "replicas"))
        self._on_routed = (
            dispatch(hook.on_routed, ("request", "replica"), False) if hook.on_routed.get_hookimpls() else None
        )
        self._on_finished = (
            dispatch(hook.on_finished, ("request", "replica"), False) if hook.on_finished.get_hookimpls() else None
        )
        # What a hook call's raise becomes, one function a hook, made once (not two closures a call: one a request).
        self._raised = {hook: self._raised_in(hook) for hook in (ROUTE, ON_ROUTED, ON_FINISHED)}
        if self.reads_reports_only and self._on_finished is not None:
            raise RouterError(
                self.name,
                "declares reads_reports_only and implements on_finished: a router routed ahead "
                "learns of finishes after later choices; drop one of the two",
            )

    def _raised_in(self, hook: str):
        """The ``RouterError`` for what the router's ``hook`` raised (its line: the router's, not the cluster's)."""
        return lambda exc: RouterError(self.name, f"raised {exception_text(exc, _OWN_FILES)}", hook)

    def _invalid(self, _, exc, *__) -> RouterError:
        """pluggy's complaint, on one line."""
        return RouterError(self.name, "invalid plugin: " + "; ".join(str(exc).splitlines()))

    def route(
        self, request, replicas: list, now: float, staleness: float, reports_only: bool = False
    ) -> tuple[Any, str]:
        """Ask the router for ``request`` among ``replicas`` (the cluster's ``Replica`` objects) at ``now``;
        the chosen replica and the router's reason. Views show reports at least ``staleness`` old, and
        only those if ``reports_only``."""
        call = RoutingCall(now, staleness, self.name, reports_only, ROUTE, request, replicas)
        answer = self._call(self._route, call)
        reason = ""
        if type(answer) is Route and len(answer) == 2:
            answer, reason = answer
            problem = _unrecordable(reason)
            if problem is not None:
                raise RouterError(self.name, f"gave the reason {quote(reason)}: {problem}", ROUTE)
        replica, wrong = chosen(answer, call)
        if replica is None:
            raise RouterError(
                self.name,
                f"returned {wrong} for request {request.request_id!r}: return one of the replicas given in this call",
                ROUTE,
            )
        return replica, reason

    def routed(self, request, replica, now: float, staleness: float = 0.0, reports_only: bool = False) -> None:
        """Tell the router where ``request`` went (its view as stale as a routing call's: the router knows no more
        then)."""
        if self._on_routed is not None:
            self._call(
                self._on_routed, RoutingCall(now, staleness, self.name, reports_only, ON_ROUTED, request, [replica])
            )

    def finished(self, request, replica, now: float, staleness: float = 0.0) -> None:
        """Tell the router that ``request`` finished on ``replica``."""
        if self._on_finished is not None:
            self._call(
                self._on_finished, RoutingCall(now, staleness, self.name, False, ON_FINISHED, request, [replica])
            )

    def _call(self, hook, call: RoutingCall):
        """A hook call, with the views ``call`` makes (the replicas for ``route_request``, the one replica
        otherwise): anything it raises but KeyboardInterrupt (SystemExit too) is a ``RouterError``
        naming the router, the hook and its line; a read its views refused is raised even if the router
        caught it; the views close when it returns."""
        request, views = call.begin()
        try:
            return call_hook(
                hook,
                (request, views if call.hook == ROUTE else views[0]),
                partial(getattr, call, "refused"),  # its first refusal, read with no frame
                self._raised[call.hook],
                RouterError,
            )
        finally:
            call.end()
