"""Finding and loading policies (entry-point group ``kvsched.policies``): every read of plugin code.

Loading a policy runs its code (the import, attribute reads, the constructor, pluggy's look at its
methods): each step goes through ``guarded``, so that whatever a plugin raises there, SystemExit
included, becomes a one-line ``PolicyError`` naming the policy and where it comes from.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import TypeAdapter, ValidationError

from kvsched.core.boundary import call_hook, exception_text
from kvsched.core.errors import KvschedError, PolicyError, UnknownPolicyError, error_text, quote, type_name

ENTRY_POINT_GROUP = "kvsched.policies"
GROUPS = {"policy": ENTRY_POINT_GROUP, "router": "kvsched.routers"}  # the kinds of plugin, and where each is registered
DEFAULT_POLICY = "vllm-default"
BUILTIN_DISTRIBUTION = "kvsched"
SELECT_BATCH, CHOOSE_PREEMPTION, CAN_ALLOCATE, ON_STEP = "select_batch", "choose_preemption", "can_allocate", "on_step"
HOOKS = (SELECT_BATCH, CHOOSE_PREEMPTION, CAN_ALLOCATE, ON_STEP)


class AmbiguousPolicyError(KvschedError, LookupError):
    """Several installed distributions register the requested policy name; ``DIST:NAME`` picks one."""


@dataclass(frozen=True)
class PolicyInfo:
    """An installed policy as its package metadata describes it (nothing is imported)."""

    name: str
    distribution: str
    version: str
    target: str  # "module:attr" the entry point loads
    ambiguous: bool = False  # another distribution registers the same name

    @property
    def spec(self) -> str:
        """What ``--policy`` takes to choose this one: its name, or ``DIST:NAME`` when the name is ambiguous."""
        return f"{self.distribution}:{self.name}" if self.ambiguous else self.name

    @property
    def origin(self) -> str:
        return f"distribution {self.distribution} {self.version}"


def installed_policies(kind: str = "policy") -> list[PolicyInfo]:
    """Every policy (or plugin of ``kind``) registered by (name, distribution), read from metadata only."""
    infos = sorted((_info(ep) for ep in entry_points(group=GROUPS[kind])), key=lambda i: (i.name, i.distribution))
    names = [i.name for i in infos]
    return [PolicyInfo(i.name, i.distribution, i.version, i.target, names.count(i.name) > 1) for i in infos]


def available_policies(kind: str = "policy") -> dict[str, PolicyInfo]:
    """Every installed policy (or plugin of ``kind``) by the spec that chooses it (``PolicyInfo.spec``)."""
    return {info.spec: info for info in installed_policies(kind)}


def _info(ep: EntryPoint) -> PolicyInfo:
    dist = ep.dist
    return PolicyInfo(ep.name, (dist and dist.name) or "?", (dist and dist.version) or "?", ep.value)


def _normalized(distribution: str) -> str:
    """A distribution name as PyPI compares them (``Kvsched_Priority.VIP`` is ``kvsched-priority-vip``)."""
    return re.sub(r"[-_.]+", "-", distribution).lower()


def _registered(name: str, kind: str) -> list[tuple[EntryPoint, PolicyInfo]]:
    return sorted(
        ((ep, _info(ep)) for ep in entry_points(group=GROUPS[kind], name=name)), key=lambda pair: pair[1].distribution
    )


def _of_distribution(distribution: str, name: str, kind: str) -> tuple[EntryPoint, PolicyInfo] | None:
    """The entry point ``name`` of ``distribution`` (``DIST:NAME``), if it registers one."""
    return next(
        ((ep, i) for ep, i in _registered(name, kind) if _normalized(i.distribution) == _normalized(distribution)), None
    )


def _entry_point(spec: str, kind: str) -> tuple[EntryPoint, PolicyInfo] | None:
    """The entry point ``spec`` names: ``NAME`` (refused when several distributions register it) or
    ``DIST:NAME``; None for a ``file.py:Attr`` or ``module:Attr`` spec."""
    if ":" in spec:
        distribution, _, name = spec.rpartition(":")
        return None if distribution.endswith(".py") else _of_distribution(distribution, name, kind)
    found = _registered(spec, kind)
    if not found:
        names = ", ".join(available_policies(kind)) or "none installed"
        raise UnknownPolicyError(f"unknown {kind} {spec!r}; available: {names} (or path/to/file.py:Class)")
    if len(found) > 1:
        which = ", ".join(f"{i.distribution} {i.version} ({i.target})" for _, i in found)
        choices = " or ".join(f"--{kind} {i.distribution}:{spec}" for _, i in found)
        raise AmbiguousPolicyError(
            f"{kind} name {spec!r} is registered by {len(found)} distributions: {which}; choose one with {choices}"
        )
    return found[0]


# id(policy) -> (policy, name, origin) of the latest policies load_policy returned, so that an error
# in a later step (its constructor, an attribute) names it as it was loaded
_ORIGINS: dict[int, tuple[Any, str, str]] = {}
_KEEP_ORIGINS = 64


def load_policy(spec: str, kind: str = "policy") -> Any:
    """Import the object behind ``spec`` (a class, an instance or a module): an installed policy's (or
    plugin of ``kind``'s) name (``DIST:NAME`` when several distributions register it), or
    ``path/to/file.py:Attr`` / ``package.module:Attr``, so that a draft runs before it is packaged."""
    found = _entry_point(spec, kind)
    if found is None:
        target, _, attr = spec.rpartition(":")
        policy, origin = _load_target(spec, kind), f"file {target}" if target.endswith(".py") else f"module {target}"
    else:
        ep, info = found
        policy, origin = guarded(spec, info.origin, f"its entry point {ep.value} fails to load", ep.load), info.origin
    if policy is None or isinstance(policy, (bool, int, float, str, bytes)):
        raise PolicyError(spec, f"is {quote(policy)}, not a {kind} class, instance or module{_from(origin)}")
    _remember(policy, spec, origin)
    declared_name(policy)  # a name of the wrong type is refused however the policy is chosen
    if found is None:
        _remember(policy, policy_name(spec, policy, kind), origin)
    return policy


def _remember(policy: Any, name: str, origin: str) -> None:
    _ORIGINS.pop(id(policy), None)
    while len(_ORIGINS) >= _KEEP_ORIGINS:
        del _ORIGINS[next(iter(_ORIGINS))]
    _ORIGINS[id(policy)] = (policy, name, origin)


def _load_target(spec: str, kind: str) -> Any:
    target, _, attr = spec.rpartition(":")
    if target.endswith(".py"):
        path = Path(target).resolve()
        if not path.is_file():
            raise UnknownPolicyError(f"{kind} file {target!r} does not exist")
        loader = importlib.util.spec_from_file_location(f"kvsched_policy_file_{path.stem}", path)
        module = importlib.util.module_from_spec(loader)
        guarded(spec, "", "the file fails to load", loader.loader.exec_module, module)
    else:
        try:
            module = guarded(spec, "", "the module fails to load", importlib.import_module, target)
        except PolicyError as exc:
            if not isinstance(exc.__cause__, ImportError):
                raise
            registered = [
                i.name for i in installed_policies(kind) if _normalized(i.distribution) == _normalized(target)
            ]
            if registered:
                raise UnknownPolicyError(
                    f"distribution {target!r} registers no {kind} {attr!r}; its "
                    f"{GROUPS[kind].removeprefix('kvsched.')}: {', '.join(registered)}"
                ) from None
            raise UnknownPolicyError(f"cannot import {kind} module {target!r}: {exc.__cause__}") from None
    try:
        return guarded(spec, "", f"reading {attr!r} of it fails", getattr, module, attr)
    except PolicyError as exc:
        if isinstance(exc.__cause__, AttributeError):
            raise UnknownPolicyError(f"{target!r} has no attribute {attr!r}") from None
        raise


def guarded(who: str, origin: str, doing: str, call, *args, **kwargs) -> Any:
    """``call(*args, **kwargs)``: plugin code. Anything it raises but KeyboardInterrupt (SystemExit,
    GeneratorExit, a PolicyError of its own too) becomes one ``PolicyError`` naming the plugin
    (``who``, from ``origin``), what failed (``doing``) and the plugin's line."""
    failure = lambda exc: PolicyError(who, f"{doing}: {exception_text(exc)}{_from(origin)}")  # noqa: E731
    return call_hook(lambda: call(*args, **kwargs), (), lambda: None, failure, ())


def _from(origin: str) -> str:
    return f" (from {origin})" if origin else ""


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


def resolve_plugin(plugin: str | Any, kind: str = "policy") -> tuple[Any, str, bool]:
    """A plugin given by spec (loaded) or as an object: ``(the object, its name, whether an installed one was chosen by
    the name the user knows it by)``; a number, bytes or None is refused."""
    if issubclass(type(plugin), str):
        spec, plugin = plugin, load_policy(plugin, kind)
        name = policy_name(spec, plugin, kind)
        return plugin, name, name == spec
    if plugin is None or issubclass(type(plugin), (bool, int, float, bytes)):
        raise PolicyError(type_name(plugin), f"is {quote(plugin)}, not a {kind} class, instance or module")
    return plugin, declared_name(plugin) or identity(plugin)[0], False


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
    """The policy's own ``name`` attribute: a non-empty ``str`` (no subclass, whose methods are plugin code), or None."""
    name = policy_attribute(policy, "name", None, who)
    if name is None or (type(name) is str and name):
        return name
    who, origin = identity(policy, who)
    raise PolicyError(who, f"its name is {quote(name)}, not a non-empty string{_from(origin)}")


def engine_defaults(policy: Any, who: str | None = None) -> dict[str, Any]:
    """The policy's ``engine_defaults`` (the settings it is meant to run with) as a plain dict:
    a mapping of setting names, else a ``PolicyError`` naming the policy."""
    defaults = policy_attribute(policy, "engine_defaults", None, who)
    if defaults is None:
        return {}
    name, origin = identity(policy, who)
    if not isinstance(defaults, Mapping):
        raise PolicyError(
            name, f"its engine_defaults is {quote(defaults)}, not a dict of engine settings{_from(origin)}"
        )
    copied = guarded(name, origin, "reading its engine_defaults fails", dict, defaults)
    bad = [key for key in copied if not isinstance(key, str)]
    if bad:
        raise PolicyError(
            name, f"its engine_defaults has {quote(bad[0])} as a setting name, not a string{_from(origin)}"
        )
    return copied


def policy_name(spec: str, policy: Any, kind: str = "policy") -> str:
    """How a policy given as ``spec`` is named in messages: an installed policy by what the user typed
    (``NAME`` or ``DIST:NAME``), a file's or module's by the ``name`` it declares itself, else by the
    attribute's (a draft subclass of ``vllm-default`` is not ``vllm-default``)."""
    target, colon, attr = spec.rpartition(":")
    if not colon or (not target.endswith(".py") and _of_distribution(target, attr, kind) is not None):
        return spec
    return _own_name(policy) or attr


def describe(policy: Any) -> str:
    """The first line of a policy's docstring (what ``engine policies`` prints)."""
    name, origin = identity(policy)
    doc = guarded(name, origin, "reading its docstring fails", inspect.getdoc, policy) or ""
    return doc.strip().splitlines()[0] if isinstance(doc, str) and doc.strip() else ""


def constructor_signature(policy: Any, who: str | None = None) -> tuple[dict[str, inspect.Parameter], dict[str, Any]]:
    """A policy class's constructor parameters and their type hints (none where an annotation does
    not resolve: the constructor checks what it gets), for checking options before an engine exists."""
    name, origin = identity(policy, who)
    params = guarded(name, origin, "reading its constructor's signature fails", inspect.signature, policy).parameters
    try:
        hints = guarded(name, origin, "", lambda: typing.get_type_hints(policy.__init__))
    except PolicyError:
        hints = {}
    return dict(params), hints


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


def _own_name(obj: Any) -> str | None:
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
