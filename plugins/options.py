"""A plugin's options, checked once against its class's constructor and converted as its annotations say (pydantic),
and the fresh instance made with them: a policy's per engine, a router's per fleet, so that state is never shared."""

from __future__ import annotations

import inspect
import typing
from typing import Any

from pydantic import TypeAdapter, ValidationError

from kvsched.errors import PolicyError, error_text, quote
from kvsched.plugins.boundary import guarded
from kvsched.plugins.identity import identity


def constructor_signature(policy: Any, who: str | None = None) -> tuple[dict[str, inspect.Parameter], dict[str, Any]]:
    """A policy class's constructor parameters and their type hints (``_hints``; none where an annotation does not
    resolve: the constructor checks what it gets), for checking options before an engine exists."""
    name, origin = identity(policy, who)
    params = guarded(name, origin, "reading its constructor's signature fails", inspect.signature, policy).parameters
    try:
        hints = guarded(name, origin, "", _hints, policy)
    except PolicyError:
        hints = {}
    return dict(params), hints


def _hints(policy: type) -> dict[str, Any]:
    """The type hints of a class's constructor and, where it takes ``**kwargs``, of the constructors of its bases it
    passes them on to (a builtin's ``**v1`` to ``VllmV1``), up to one that takes none: an option is converted once,
    here, whichever constructor names it."""
    hints: dict[str, Any] = {}
    for cls in policy.__mro__[:-1]:  # not object's
        init = policy.__init__ if cls is policy else vars(cls).get("__init__")
        if init is not None:
            try:
                hints = {**typing.get_type_hints(init), **hints}
            except Exception:  # a base's annotations that do not resolve: its own constructor checks what it gets
                if cls is policy:
                    raise
                break
            if all(p.kind is not p.VAR_KEYWORD for p in inspect.signature(init).parameters.values()):
                break
    return hints


class OptionError(PolicyError):
    """An option the plugin's constructor does not take (``hint`` None), or a value its annotation ``hint`` refuses;
    ``reason`` says which, for a caller that names the option its own way (``--policy-opt KEY=VALUE``)."""

    def __init__(self, who: str, message: str, key: str, value: Any, reason: str, hint: Any = None) -> None:
        super().__init__(who, message)
        self.key, self.value, self.reason, self.hint = key, value, reason, hint


def checked_options(plugin: Any, options: dict[str, Any] | None, who: str, kind: str = "policy") -> dict[str, Any]:
    """``options`` (strings from the command line, or values) checked against the plugin class's constructor and
    converted as its annotations say (pydantic, lax; a value whose annotation it cannot check is left to the
    constructor): an unknown key or a refused value is an ``OptionError``."""
    if not options:
        return {}
    _, origin = identity(plugin, who)
    if not guarded(who, origin, "inspecting it fails", inspect.isclass, plugin):
        raise PolicyError(who, f"options {quote(options)} given, but the {kind} is not a class")
    params, hints = constructor_signature(plugin, who)
    any_key = any(p.kind is p.VAR_KEYWORD for p in params.values())
    out = {}
    for key, value in options.items():
        if key not in params and not any_key:
            reason = f"has no option {quote(key)}; its options: {', '.join(params) or 'none'}"
            raise OptionError(who, reason, key, value, reason)
        try:
            check = TypeAdapter(hints[key]).validate_python if key in hints else None
        except Exception:  # an annotation pydantic cannot check: the constructor checks the value
            check = None
        try:
            out[key] = (
                value if check is None else guarded(who, origin, f"checking option {key}", check, value, strict=False)
            )
        except PolicyError as exc:
            if not isinstance(exc.__cause__, ValidationError):
                raise
            reason = exc.__cause__.errors()[0]["msg"]
            raise OptionError(who, f"option {key}={quote(value)}: {reason}", key, value, reason, hints[key]) from None
    return out


def instantiate(policy: Any, options: dict[str, Any] | None = None, who: str | None = None) -> Any:
    """A class becomes a fresh instance (per engine, so policy state is never shared), with ``options`` as
    ``checked_options`` gives them."""
    name, origin = identity(policy, who)
    if not guarded(name, origin, "inspecting it fails", inspect.isclass, policy):
        return policy
    try:
        return guarded(name, origin, "its constructor fails", policy, **(options or {}))
    except PolicyError as exc:
        if options and isinstance(exc.__cause__, (TypeError, ValueError)):
            raise PolicyError(name, f"bad options {options}: {error_text(exc.__cause__)}") from exc.__cause__
        raise
