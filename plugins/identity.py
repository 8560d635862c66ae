"""What a loaded plugin is called and declares of itself: its name and where it comes from (for every message about
it), its ``name``, docstring, ``engine_defaults`` and any other attribute, each read through the boundary (a raising
property or ``__getattr__`` is the plugin's ``PolicyError``, never the caller's crash)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from kvsched.errors import PolicyError, quote, type_name
from kvsched.plugins.boundary import from_origin, guarded

# id(plugin) -> (plugin, name, origin) of the latest plugins loaded, so that an error in a later step (its
# constructor, an attribute) names it as it was loaded
_ORIGINS: dict[int, tuple[Any, str, str]] = {}
_KEEP_ORIGINS = 64


def remember(policy: Any, name: str, origin: str) -> None:
    """Name ``policy`` as loaded (``name``, from ``origin``) in what ``identity`` says of it from now on."""
    _ORIGINS.pop(id(policy), None)
    while len(_ORIGINS) >= _KEEP_ORIGINS:
        del _ORIGINS[next(iter(_ORIGINS))]
    _ORIGINS[id(policy)] = (policy, name, origin)


def identity(policy: Any, fallback: str | None = None) -> tuple[str, str]:
    """``(name, origin)`` of ``policy`` for messages: as ``load_policy`` loaded it, else ``fallback``
    or what the object calls itself; never raises (it is used to report what did)."""
    for loaded in (policy, type(policy)):  # an instance of a loaded class is known by the class
        entry = _ORIGINS.get(id(loaded))
        if entry is not None and entry[0] is loaded:
            return fallback or entry[1], entry[2]
    try:
        declared = inspect.getattr_static(policy, "name", None)
        own = declared if isinstance(declared, str) and declared else None
        label = (
            type.__dict__["__name__"].__get__(policy)
            if issubclass(type(policy), type)
            else (inspect.getattr_static(policy, "__name__", None) if issubclass(type(policy), ModuleType) else None)
        )
        return fallback or own or str(label or type_name(policy)), ""
    except Exception:
        return fallback or type(policy).__name__, ""


def policy_attribute(policy: Any, attr: str, default: Any = None, who: str | None = None) -> Any:
    """``getattr(policy, attr, default)``, where a failing read (a raising property or ``__getattr__``)
    is a ``PolicyError`` naming the policy, not the caller's crash."""
    name, origin = identity(policy, who)
    try:
        return guarded(name, origin, f"reading its {attr!r} fails", getattr, policy, attr)
    except PolicyError as exc:
        if isinstance(exc.__cause__, AttributeError):
            return default
        raise


def declared_name(policy: Any, who: str | None = None) -> str | None:
    """The policy's ``name`` attribute: a non-empty ``str`` (no subclass, whose methods are plugin code), or None."""
    name = policy_attribute(policy, "name", None, who)
    if name is None or (type(name) is str and name):
        return name
    who, origin = identity(policy, who)
    raise PolicyError(who, f"its name is {quote(name)}, not a non-empty string{from_origin(origin)}")


def own_name(obj: Any) -> str | None:
    """The ``name`` ``obj`` declares itself: in a class's own body (not one it inherits), a module's,
    an instance's or its class's body; None where it declares none, or cannot be read."""
    try:
        owners = (obj,) if isinstance(obj, (type, ModuleType)) else (obj, type(obj))
        for owner in owners:
            name = vars(owner).get("name", None) if hasattr(owner, "__dict__") else None
            if isinstance(name, str) and name:
                return name
    except KeyboardInterrupt:
        raise
    except BaseException:  # a __dict__ that raises: fall back to what the user typed
        return None
    return None


def describe(policy: Any) -> str:
    """The first line of a policy's docstring (what ``engine policies`` prints)."""
    name, origin = identity(policy)
    doc = guarded(name, origin, "reading its docstring fails", inspect.getdoc, policy) or ""
    return doc.strip().splitlines()[0] if isinstance(doc, str) and doc.strip() else ""


def engine_defaults(policy: Any, who: str | None = None) -> dict[str, Any]:
    """The policy's ``engine_defaults`` (the settings it is meant to run with) as a plain dict:
    a mapping of setting names, else a ``PolicyError`` naming the policy."""
    defaults = policy_attribute(policy, "engine_defaults", None, who)
    if defaults is None:
        return {}
    name, origin = identity(policy, who)
    if not isinstance(defaults, Mapping):
        raise PolicyError(
            name, f"its engine_defaults is {quote(defaults)}, not a dict of engine settings{from_origin(origin)}"
        )
    copied = guarded(name, origin, "reading its engine_defaults fails", dict, defaults)
    bad = [key for key in copied if not isinstance(key, str)]
    if bad:
        raise PolicyError(
            name, f"its engine_defaults has {quote(bad[0])} as a setting name, not a string{from_origin(origin)}"
        )
    return copied
