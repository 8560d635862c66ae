"""Finding, loading and calling policies (entry-point group ``kvsched.policies``).

Loading a policy runs its code (the import, attribute reads, the constructor, pluggy's look at its
methods): each step goes through ``_guarded``, so that whatever a plugin raises there, SystemExit
included, becomes a one-line ``PolicyError`` naming the policy and where it comes from.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import re
import sysconfig
import traceback
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from types import ModuleType
from typing import Any

import pluggy

from kvsched import allocators
from kvsched.core import hookspecs
from kvsched.core.defaults import CoreDefaults
from kvsched.core.errors import KvschedError, PolicyError, UnknownPolicyError, error_text, quote

ENTRY_POINT_GROUP = "kvsched.policies"
DEFAULT_POLICY = "vllm-default"
BUILTIN_DISTRIBUTION = "kvsched"
SELECT_BATCH, CHOOSE_PREEMPTION, CAN_ALLOCATE, ON_STEP = "select_batch", "choose_preemption", "can_allocate", "on_step"
HOOKS = (SELECT_BATCH, CHOOSE_PREEMPTION, CAN_ALLOCATE, ON_STEP)
# Frames in these files are the engine's, pluggy's or Python's own, never a plugin's.
_ENGINE_FILES = tuple(os.path.dirname(m.__file__) + os.sep for m in (pluggy, hookspecs, allocators))
_STDLIB, _SITE = sysconfig.get_paths()["stdlib"], (sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"])


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


def installed_policies() -> list[PolicyInfo]:
    """Every policy registered under ``kvsched.policies`` by (name, distribution), read from metadata only."""
    infos = sorted((_info(ep) for ep in entry_points(group=ENTRY_POINT_GROUP)), key=lambda i: (i.name, i.distribution))
    names = [i.name for i in infos]
    return [PolicyInfo(i.name, i.distribution, i.version, i.target, names.count(i.name) > 1) for i in infos]


def available_policies() -> dict[str, PolicyInfo]:
    """Every installed policy by the spec that chooses it (``PolicyInfo.spec``)."""
    return {info.spec: info for info in installed_policies()}


def _info(ep: EntryPoint) -> PolicyInfo:
    dist = ep.dist
    return PolicyInfo(ep.name, (dist and dist.name) or "?", (dist and dist.version) or "?", ep.value)


def _normalized(distribution: str) -> str:
    """A distribution name as PyPI compares them (``Kvsched_Priority.VIP`` is ``kvsched-priority-vip``)."""
    return re.sub(r"[-_.]+", "-", distribution).lower()


def _registered(name: str) -> list[tuple[EntryPoint, PolicyInfo]]:
    return sorted(((ep, _info(ep)) for ep in entry_points(group=ENTRY_POINT_GROUP, name=name)), key=lambda pair: pair[1].distribution)


def _of_distribution(distribution: str, name: str) -> tuple[EntryPoint, PolicyInfo] | None:
    """The entry point ``name`` of ``distribution`` (``DIST:NAME``), if it registers one."""
    return next(((ep, i) for ep, i in _registered(name) if _normalized(i.distribution) == _normalized(distribution)), None)


def _entry_point(spec: str) -> tuple[EntryPoint, PolicyInfo] | None:
    """The entry point ``spec`` names: ``NAME`` (refused when several distributions register it) or
    ``DIST:NAME``; None for a ``file.py:Attr`` or ``module:Attr`` spec."""
    if ":" in spec:
        distribution, _, name = spec.rpartition(":")
        return None if distribution.endswith(".py") else _of_distribution(distribution, name)
    found = _registered(spec)
    if not found:
        names = ", ".join(available_policies()) or "none installed"
        raise UnknownPolicyError(f"unknown policy {spec!r}; available: {names} (or path/to/file.py:Class)")
    if len(found) > 1:
        which = ", ".join(f"{i.distribution} {i.version} ({i.target})" for _, i in found)
        choices = " or ".join(f"--policy {i.distribution}:{spec}" for _, i in found)
        raise AmbiguousPolicyError(f"policy name {spec!r} is registered by {len(found)} distributions: {which}; choose one with {choices}")
    return found[0]


# id(policy) -> (policy, name, origin) of the latest policies load_policy returned, so that an error
# in a later step (its constructor, an attribute) names it as it was loaded
_ORIGINS: dict[int, tuple[Any, str, str]] = {}
_KEEP_ORIGINS = 64


def load_policy(spec: str) -> Any:
    """Import the object behind ``spec`` (a class, an instance or a module): an installed policy's
    name (``DIST:NAME`` when several distributions register it), or ``path/to/file.py:Attr`` /
    ``package.module:Attr``, so that a draft runs before it is packaged."""
    found = _entry_point(spec)
    if found is None:
        target, _, attr = spec.rpartition(":")
        policy, origin = _load_target(spec), f"file {target}" if target.endswith(".py") else f"module {target}"
    else:
        ep, info = found
        policy, origin = _guarded(spec, info.origin, f"its entry point {ep.value} fails to load", ep.load), info.origin
    if policy is None or isinstance(policy, (bool, int, float, str, bytes)):
        raise PolicyError(spec, f"is {quote(policy)}, not a policy class, instance or module{_from(origin)}")
    _remember(policy, spec, origin)
    declared_name(policy)  # a name of the wrong type is refused however the policy is chosen
    if found is None:
        _remember(policy, policy_name(spec, policy), origin)
    return policy


def _remember(policy: Any, name: str, origin: str) -> None:
    _ORIGINS.pop(id(policy), None)
    while len(_ORIGINS) >= _KEEP_ORIGINS:
        del _ORIGINS[next(iter(_ORIGINS))]
    _ORIGINS[id(policy)] = (policy, name, origin)


def _load_target(spec: str) -> Any:
    target, _, attr = spec.rpartition(":")
    if target.endswith(".py"):
        path = Path(target).resolve()
        if not path.is_file():
            raise UnknownPolicyError(f"policy file {target!r} does not exist")
        loader = importlib.util.spec_from_file_location(f"kvsched_policy_file_{path.stem}", path)
        module = importlib.util.module_from_spec(loader)
        _guarded(spec, "", "the file fails to load", loader.loader.exec_module, module)
    else:
        try:
            module = _guarded(spec, "", "the module fails to load", importlib.import_module, target)
        except PolicyError as exc:
            if not isinstance(exc.__cause__, ImportError):
                raise
            registered = [i.name for i in installed_policies() if _normalized(i.distribution) == _normalized(target)]
            if registered:
                raise UnknownPolicyError(f"distribution {target!r} registers no policy {attr!r}; its policies: {', '.join(registered)}") from None
            raise UnknownPolicyError(f"cannot import policy module {target!r}: {exc.__cause__}") from None
    try:
        return _guarded(spec, "", f"reading {attr!r} of it fails", getattr, module, attr)
    except PolicyError as exc:
        if isinstance(exc.__cause__, AttributeError):
            raise UnknownPolicyError(f"{target!r} has no attribute {attr!r}") from None
        raise


def _guarded(who: str, origin: str, doing: str, call, *args, **kwargs) -> Any:
    """``call(*args, **kwargs)``: plugin code. Anything it raises but KeyboardInterrupt (SystemExit,
    GeneratorExit, a PolicyError of its own too) becomes one ``PolicyError`` naming the plugin
    (``who``, from ``origin``), what failed (``doing``) and the plugin's line."""
    try:
        return call(*args, **kwargs)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        raise PolicyError(who, f"{doing}: {_exception_text(exc)}{_from(origin)}") from exc


def _from(origin: str) -> str:
    return f" (from {origin})" if origin else ""


def _exception_text(exc: BaseException) -> str:
    """``Type: message (at file:line)`` on one line, even when the exception's own ``__str__`` raises."""
    text = " ".join(error_text(exc).split())
    frames = list(traceback.walk_tb(exc.__traceback__))[::-1]
    return f"{type(exc).__name__}: {text}{_plugin_line(frames)}" if text else f"{type(exc).__name__}{_plugin_line(frames)}"


def _identity(policy: Any, fallback: str | None = None) -> tuple[str, str]:
    """``(name, origin)`` of ``policy`` for messages: as ``load_policy`` loaded it, else ``fallback``
    or what the object calls itself; never raises (it is used to report what did)."""
    for loaded in (policy, type(policy)):  # an instance of a loaded class is known by the class
        entry = _ORIGINS.get(id(loaded))
        if entry is not None and entry[0] is loaded:
            return fallback or entry[1], entry[2]
    try:
        declared = inspect.getattr_static(policy, "name", None)
        own = declared if isinstance(declared, str) and declared else None
        return fallback or own or str(inspect.getattr_static(policy, "__name__", None) or type(policy).__name__), ""
    except Exception:
        return fallback or type(policy).__name__, ""


def policy_attribute(policy: Any, attr: str, default: Any = None, who: str | None = None) -> Any:
    """``getattr(policy, attr, default)``, where a failing read (a raising property or ``__getattr__``)
    is a ``PolicyError`` naming the policy, not the caller's crash."""
    name, origin = _identity(policy, who)
    try:
        return _guarded(name, origin, f"reading its {attr!r} fails", getattr, policy, attr)
    except PolicyError as exc:
        if isinstance(exc.__cause__, AttributeError):
            return default
        raise


def declared_name(policy: Any, who: str | None = None) -> str | None:
    """The policy's own ``name`` attribute: a non-empty string, or None when it declares none."""
    name = policy_attribute(policy, "name", None, who)
    if name is None or (isinstance(name, str) and name):
        return name
    who, origin = _identity(policy, who)
    raise PolicyError(who, f"its name is {quote(name)}, not a non-empty string{_from(origin)}")


def engine_defaults(policy: Any, who: str | None = None) -> dict[str, Any]:
    """The policy's ``engine_defaults`` (the settings it is meant to run with) as a plain dict:
    a mapping of setting names, else a ``PolicyError`` naming the policy."""
    defaults = policy_attribute(policy, "engine_defaults", None, who)
    if defaults is None:
        return {}
    name, origin = _identity(policy, who)
    if not isinstance(defaults, Mapping):
        raise PolicyError(name, f"its engine_defaults is {quote(defaults)}, not a dict of engine settings{_from(origin)}")
    copied = _guarded(name, origin, "reading its engine_defaults fails", dict, defaults)
    bad = [key for key in copied if not isinstance(key, str)]
    if bad:
        raise PolicyError(name, f"its engine_defaults has {quote(bad[0])} as a setting name, not a string{_from(origin)}")
    return copied


def policy_name(spec: str, policy: Any) -> str:
    """How a policy given as ``spec`` is named in messages: an installed policy by what the user typed
    (``NAME`` or ``DIST:NAME``), a file's or module's by the ``name`` it declares itself, else by the
    attribute's (a draft subclass of ``vllm-default`` is not ``vllm-default``)."""
    target, colon, attr = spec.rpartition(":")
    if not colon or (not target.endswith(".py") and _of_distribution(target, attr) is not None):
        return spec
    return _own_name(policy) or attr


def describe(policy: Any) -> str:
    """The first line of a policy's docstring (what ``engine policies`` prints)."""
    name, origin = _identity(policy)
    doc = _guarded(name, origin, "reading its docstring fails", inspect.getdoc, policy) or ""
    return doc.strip().splitlines()[0] if isinstance(doc, str) and doc.strip() else ""


def constructor_signature(policy: Any, who: str | None = None) -> tuple[dict[str, inspect.Parameter], dict[str, Any]]:
    """A policy class's constructor parameters and their type hints (none where an annotation does
    not resolve: the constructor checks what it gets), for checking options before an engine exists."""
    name, origin = _identity(policy, who)
    params = _guarded(name, origin, "reading its constructor's signature fails", inspect.signature, policy).parameters
    try:
        hints = _guarded(name, origin, "", lambda: typing.get_type_hints(policy.__init__))
    except PolicyError:
        hints = {}
    return dict(params), hints


def instantiate(policy: Any, options: dict[str, Any] | None = None, who: str | None = None) -> Any:
    """A class becomes a fresh instance (per engine, so policy state is never shared)."""
    name, origin = _identity(policy, who)
    if not _guarded(name, origin, "inspecting it fails", inspect.isclass, policy):
        if options:
            raise PolicyError(name, "options given, but the policy is not a class")
        return policy
    try:
        return _guarded(name, origin, "its constructor fails", policy, **(options or {}))
    except PolicyError as exc:
        if options and isinstance(exc.__cause__, (TypeError, ValueError)):
            raise PolicyError(name, f"bad policy options {options}: {error_text(exc.__cause__)}") from exc.__cause__
        raise


class PolicyHooks:
    """A typed facade over one engine's plugin manager: the chosen policy plus the core defaults.

    ``policy`` is an installed policy's name or a policy object (class, instance or module).
    Observers (anything with ``on_step``) may be added; they never decide.

    It runs the hooks: ``in_hook`` names the one running (so the core can ``refuse`` what it may not
    do), an exception becomes a ``PolicyError`` naming plugin, hook and line, and the first error
    of a hook call is the one it raises, even if the plugin caught it.
    """

    def __init__(self, policy: str | Any = DEFAULT_POLICY, options: dict[str, Any] | None = None, observers: tuple = ()) -> None:
        if isinstance(policy, str):
            spec, policy = policy, load_policy(policy)
            self.name = policy_name(spec, policy)
            self._chosen_by_name = self.name == spec  # an installed policy, by the name the user knows it by
        else:
            if policy is None or isinstance(policy, (bool, int, float, str, bytes)):
                raise PolicyError(type(policy).__name__, f"is {quote(policy)}, not a policy class, instance or module")
            self.name, self._chosen_by_name = declared_name(policy) or _identity(policy)[0], False
        self.policy = instantiate(policy, options, self.name)
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.pm.register(CoreDefaults(), name="kvsched-core-defaults")
        self._observers = [f"{type(o).__name__}-{i}" for i, o in enumerate(observers)]
        for plugin, name in ((self.policy, self.name), *zip(observers, self._observers)):
            self._register(plugin, name)
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            raise self._invalid(exc, exc.plugin, self.name if exc.plugin is self.policy else self._observer_name(exc.plugin)) from exc
        if not self.pm.get_hookcallers(self.policy):
            raise PolicyError(self.name, "implements no hook: mark select_batch, choose_preemption, can_allocate or on_step with @hookimpl")
        if not self.pm.hook.select_batch.get_hookimpls():  # a policy that only picks victims or admits
            builtin = f"{BUILTIN_DISTRIBUTION}:{DEFAULT_POLICY}"  # never another distribution's vllm-default
            self.pm.register(instantiate(load_policy(builtin)), name=f"{DEFAULT_POLICY}-fallback")
        hook = self.pm.hook
        self._select_batch = _dispatch(hook.select_batch, ("step",))
        self._choose_preemption = _dispatch(hook.choose_preemption, ("step", "requester"))
        self._can_allocate = _dispatch(hook.can_allocate, ("step", "group"))
        # Without a policy's own admission rule, ``admit`` asks the block manager itself (what the
        # core default answers), saving a hook call per admission.
        self.decides_admission = len(hook.can_allocate.get_hookimpls()) > 1
        # Everything is registered above, once: a run with no on_step implementation skips the hook call.
        self._on_step = _dispatch(hook.on_step, ("report",), firstresult=False) if hook.on_step.get_hookimpls() else None
        self.observes_steps = self._on_step is not None  # then every step gets its report: no steady runs
        self.in_hook: str | None = None
        self._first_error: PolicyError | None = None

    def _register(self, plugin: Any, name: str) -> None:
        """Register ``plugin``: pluggy reads its attributes and markers (plugin code) and checks each
        hook implementation's signature; what fails names the plugin, or the class at fault."""
        _, origin = _identity(plugin, name)
        try:
            _guarded(name, origin, "registering it fails", self.pm.register, plugin, name=name)
        except PolicyError as exc:
            cause = exc.__cause__
            if isinstance(cause, pluggy.PluginValidationError):
                raise self._invalid(cause, plugin, name) from cause
            if isinstance(cause, ValueError) and "already registered" in str(cause):
                raise PolicyError(name, f"invalid plugin: {cause}") from cause
            raise

    def _observer_name(self, plugin: Any) -> str:
        return next((n for n in self._observers if self.pm.get_plugin(n) is plugin), type(plugin).__name__)

    def _invalid(self, exc: pluggy.PluginValidationError, plugin: Any, name: str) -> PolicyError:
        """pluggy's complaint about one hook implementation, on one line, blamed on the class that
        defines it (not a name it inherits), at the line where it does."""
        reason = str(exc).splitlines()
        hook = re.search(r"hook '(\w+)'", reason[0])
        function = self._hookimpl_function(plugin, hook.group(1)) if hook else None
        if function is None:
            return PolicyError(name, "invalid plugin: " + "; ".join(reason))
        code = getattr(function, "__code__", None)
        where = f" (at {code.co_filename.removeprefix(os.getcwd() + os.sep)}:{code.co_firstlineno})" if code else ""
        qualname = getattr(function, "__qualname__", hook.group(1))
        owner = _defining_class(plugin, getattr(function, "__func__", function))
        culprit = name if self._chosen_by_name or owner is None else _own_name(owner) or owner.__qualname__
        why = reason[-1] if reason[0].startswith("Plugin") else f"kvsched has no hook {hook.group(1)!r} (hooks: {', '.join(HOOKS)})"
        return PolicyError(culprit, f"invalid plugin: {qualname}{_signature(function)}{where}: {why}")

    def _hookimpl_function(self, plugin: Any, hook: str) -> Any:
        """The function ``plugin`` marks as its implementation of ``hook`` (None if it cannot be told)."""
        try:
            for attr in dir(plugin):
                opts = self.pm.parse_hookimpl_opts(plugin, attr)
                if opts is not None and (opts.get("specname") or attr) == hook:
                    return inspect.unwrap(getattr(plugin, attr))
        except Exception:
            return None
        return None

    def configure(self, config):
        """``config`` with the policy's ``engine_defaults`` (the settings it is meant to run with, such
        as ``vllm-v1``'s V1 mechanics) filled in where the caller set nothing."""
        defaults = engine_defaults(self.policy, self.name)
        if not defaults:
            return config
        try:
            return type(config).model_validate({**defaults, **config.model_dump(exclude_unset=True)})
        except ValueError as exc:
            raise PolicyError(self.name, f"its engine_defaults {defaults} do not fit the config: {exc}") from exc

    def select_batch(self, step) -> None:
        self._call(SELECT_BATCH, self._select_batch, step)

    def choose_preemption(self, step, requester):
        return self._call(CHOOSE_PREEMPTION, self._choose_preemption, step, requester)

    def can_allocate(self, step, group):
        return self._call(CAN_ALLOCATE, self._can_allocate, step, group)

    def on_step(self, report) -> None:
        if self._on_step is not None:
            self._call(ON_STEP, self._on_step, report)

    def _call(self, name: str, hook, *args):
        outer, self.in_hook = self.in_hook, name
        first = None
        try:
            result = hook(*args)
        except Exception as exc:
            error = self._first_error or (exc if isinstance(exc, PolicyError) else self._failure(exc, name))
            if error is exc:
                raise
            raise error from exc
        finally:
            self.in_hook = outer
            if outer is None:
                first, self._first_error = self._first_error, None
        if first is not None:  # the plugin caught a refusal and carried on
            raise first
        return result

    def refuse(self, message: str, hook: str | None = None) -> PolicyError:
        """The ``PolicyError`` (to raise) for what the running plugin just tried (or ``hook`` answered)."""
        return self._error(message, hook or self.in_hook, list(traceback.walk_stack(None)))

    def _failure(self, exc: Exception, hook: str) -> PolicyError:
        return self._error(f"raised {type(exc).__name__}: {error_text(exc)}", hook, list(traceback.walk_tb(exc.__traceback__))[::-1])

    def _error(self, message: str, hook: str | None, frames: list) -> PolicyError:
        """Name the plugin whose implementation of ``hook`` is on ``frames`` ((frame, line), innermost
        first) and the innermost line of plugin code; keep the first error of a hook call."""
        impls = {getattr(i.function, "__code__", None): i.plugin_name for i in getattr(self.pm.hook, hook).get_hookimpls()} if hook else {}
        plugin = next((impls[f.f_code] for f, _ in frames if f.f_code in impls), self.name)
        observer = plugin in self._observers
        error = PolicyError(plugin if observer else self.name, message + _plugin_line(frames), hook, "observer" if observer else "policy")
        if hook is not None and self._first_error is None:
            self._first_error = error
        return error


def _dispatch(caller: pluggy.HookCaller, names: tuple[str, ...], firstresult: bool = True):
    """A function of the hook's arguments (``names``, in order) that calls its implementations as
    pluggy does, newest first, up to the first result that is not None (``firstresult``), without
    pluggy's per-call bookkeeping (a good part of a step's cost). pluggy's own call when a wrapper
    or an implementation taking other arguments is registered."""
    impls = caller.get_hookimpls()
    if any(i.hookwrapper or i.wrapper or i.kwargnames or i.argnames not in (names, ()) for i in impls):
        return lambda *args: caller(**dict(zip(names, args)))
    chain = [(i.function, bool(i.argnames)) for i in reversed(impls)]

    def call(*args):
        for function, takes_args in chain:
            result = function(*args) if takes_args else function()
            if firstresult and result is not None:
                return result
        return None

    return call


def _plugin_line(frames) -> str:
    """`` (at file:line)`` of the innermost frame of plugin code: not the engine's, pluggy's or Python's own."""
    for frame, line in frames:
        path = frame.f_code.co_filename
        if not path.startswith((*_ENGINE_FILES, "<frozen ")) and (not path.startswith(_STDLIB) or path.startswith(_SITE)):
            return f" (at {path.removeprefix(os.getcwd() + os.sep)}:{line})"
    return ""


def _defining_class(plugin: Any, function: Any) -> type | None:
    """The class in ``plugin``'s MRO whose own body defines ``function``."""
    classes = plugin.__mro__ if inspect.isclass(plugin) else type(plugin).__mro__
    for cls in classes:
        for value in vars(cls).values():
            if inspect.unwrap(getattr(value, "__func__", value)) is function:
                return cls
    return None


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


def _signature(function: Any) -> str:
    try:
        return str(inspect.signature(function))
    except (TypeError, ValueError):
        return "(...)"
