"""Finding, loading and calling policies (entry-point group ``kvsched.policies``)."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sysconfig
import traceback
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pluggy

from kvsched import allocators
from kvsched.core import hookspecs
from kvsched.core.defaults import CoreDefaults
from kvsched.core.errors import PolicyError, UnknownPolicyError, quote, shorten

ENTRY_POINT_GROUP = "kvsched.policies"
DEFAULT_POLICY = "vllm-default"
SELECT_BATCH, CHOOSE_PREEMPTION, CAN_ALLOCATE, ON_STEP = "select_batch", "choose_preemption", "can_allocate", "on_step"
# Frames in these files are the engine's, pluggy's or Python's own, never a plugin's.
_ENGINE_FILES = tuple(os.path.dirname(m.__file__) + os.sep for m in (pluggy, hookspecs, allocators))
_STDLIB, _SITE = sysconfig.get_paths()["stdlib"], (sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"])


@dataclass(frozen=True)
class PolicyInfo:
    """An installed policy as its package metadata describes it (nothing is imported)."""

    name: str
    distribution: str
    version: str
    target: str  # "module:attr" the entry point loads


def available_policies() -> dict[str, PolicyInfo]:
    """Every policy registered under ``kvsched.policies``, by name, read from metadata only."""
    found = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist
        found.setdefault(ep.name, PolicyInfo(ep.name, dist.name if dist else "?", dist.version if dist else "?", ep.value))
    return dict(sorted(found.items()))


def load_policy(spec: str) -> Any:
    """Import the object behind ``spec`` (a class, an instance or a module): an installed policy's
    name, or ``path/to/file.py:Attr`` / ``package.module:Attr``, so that a draft runs before it is packaged."""
    if ":" in spec:
        return _load_target(spec)
    matches = entry_points(group=ENTRY_POINT_GROUP, name=spec)
    if not matches:
        names = ", ".join(available_policies()) or "none installed"
        raise UnknownPolicyError(f"unknown policy {spec!r}; available: {names} (or path/to/file.py:Class)")
    ep = next(iter(matches))
    try:
        return ep.load()
    except Exception as exc:  # a broken third-party package: say which, in one line
        raise PolicyError(spec, f"its entry point {ep.value} fails to load: {type(exc).__name__}: {shorten(str(exc))}") from exc


def _load_target(spec: str) -> Any:
    target, _, attr = spec.rpartition(":")
    if target.endswith(".py"):
        path = Path(target).resolve()
        if not path.is_file():
            raise UnknownPolicyError(f"policy file {target!r} does not exist")
        loader = importlib.util.spec_from_file_location(f"kvsched_policy_file_{path.stem}", path)
        module = importlib.util.module_from_spec(loader)
        try:
            loader.loader.exec_module(module)
        except Exception as exc:
            raise PolicyError(spec, f"the file fails to load: {type(exc).__name__}: {shorten(str(exc))}") from exc
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise UnknownPolicyError(f"cannot import policy module {target!r}: {exc}") from exc
        except Exception as exc:
            raise PolicyError(spec, f"the module fails to load: {type(exc).__name__}: {shorten(str(exc))}") from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise UnknownPolicyError(f"{target!r} has no attribute {attr!r}") from None


def policy_name(spec: str, policy: Any) -> str:
    """How a policy given as ``spec`` is named in messages: its ``name``, else what the user typed."""
    return getattr(policy, "name", None) or (spec.rpartition(":")[2] if ":" in spec else spec)


def describe(policy: Any) -> str:
    """The first line of a policy's docstring (what ``engine policies`` prints)."""
    doc = inspect.getdoc(policy) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def instantiate(policy: Any, options: dict[str, Any] | None = None) -> Any:
    """A class becomes a fresh instance (per engine, so policy state is never shared)."""
    if inspect.isclass(policy):
        try:
            return policy(**(options or {}))
        except (TypeError, ValueError) as exc:
            raise PolicyError(getattr(policy, "name", policy.__name__), f"bad policy options {options}: {exc}") from exc
    if options:
        raise PolicyError(getattr(policy, "name", repr(policy)), "options given, but the policy is not a class")
    return policy


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
            self.name = spec if ":" not in spec else policy_name(spec, policy)
        else:
            self.name = getattr(policy, "name", None) or getattr(policy, "__name__", type(policy).__name__)
        if policy is None or isinstance(policy, (bool, int, float, str, bytes)):
            raise PolicyError(str(self.name), f"is {quote(policy)}, not a policy class, instance or module")
        self.policy = instantiate(policy, options)
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.pm.register(CoreDefaults(), name="kvsched-core-defaults")
        try:
            self.pm.register(self.policy, name=self.name)
            self._observers = [f"{type(o).__name__}-{i}" for i, o in enumerate(observers)]
            for observer, name in zip(observers, self._observers):
                self.pm.register(observer, name=name)
            self.pm.check_pending()
        except (pluggy.PluginValidationError, ValueError) as exc:
            raise PolicyError(self.name, f"invalid plugin: {exc}") from exc
        if not self.pm.get_hookcallers(self.policy):
            raise PolicyError(self.name, "implements no hook: mark select_batch, choose_preemption, can_allocate or on_step with @hookimpl")
        if not self.pm.hook.select_batch.get_hookimpls():  # a policy that only picks victims or admits
            self.pm.register(instantiate(load_policy(DEFAULT_POLICY)), name=f"{DEFAULT_POLICY}-fallback")
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

    def configure(self, config):
        """``config`` with the policy's ``engine_defaults`` (the settings it is meant to run with, such
        as ``vllm-v1``'s V1 mechanics) filled in where the caller set nothing."""
        defaults = getattr(self.policy, "engine_defaults", None)
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
        return self._error(f"raised {type(exc).__name__}: {shorten(str(exc))}", hook, list(traceback.walk_tb(exc.__traceback__))[::-1])

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
        if not path.startswith(_ENGINE_FILES) and (not path.startswith(_STDLIB) or path.startswith(_SITE)):
            return f" (at {path.removeprefix(os.getcwd() + os.sep)}:{line})"
    return ""
