"""Finding, loading and calling policies (entry-point group ``kvsched.policies``)."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pluggy

from kvsched.core import hookspecs
from kvsched.core.defaults import CoreDefaults
from kvsched.core.errors import PolicyError, UnknownPolicyError

ENTRY_POINT_GROUP = "kvsched.policies"
DEFAULT_POLICY = "vllm-default"


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
    return next(iter(matches)).load()


def _load_target(spec: str) -> Any:
    target, _, attr = spec.rpartition(":")
    if target.endswith(".py"):
        path = Path(target).resolve()
        if not path.is_file():
            raise UnknownPolicyError(f"policy file {target!r} does not exist")
        loader = importlib.util.spec_from_file_location(f"kvsched_policy_file_{path.stem}", path)
        module = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise UnknownPolicyError(f"cannot import policy module {target!r}: {exc}") from exc
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
    """

    def __init__(self, policy: str | Any = DEFAULT_POLICY, options: dict[str, Any] | None = None, observers: tuple = ()) -> None:
        if isinstance(policy, str):
            spec, policy = policy, load_policy(policy)
            self.name = spec if ":" not in spec else policy_name(spec, policy)
        else:
            self.name = getattr(policy, "name", None) or getattr(policy, "__name__", type(policy).__name__)
        self.policy = instantiate(policy, options)
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.pm.register(CoreDefaults(), name="kvsched-core-defaults")
        try:
            self.pm.register(self.policy, name=self.name)
            for i, observer in enumerate(observers):
                self.pm.register(observer, name=f"observer-{i}")
            self.pm.check_pending()
        except (pluggy.PluginValidationError, ValueError) as exc:
            raise PolicyError(self.name, f"invalid plugin: {exc}") from exc
        if not self.pm.hook.select_batch.get_hookimpls():  # a policy that only picks victims or admits
            self.pm.register(instantiate(load_policy(DEFAULT_POLICY)), name=f"{DEFAULT_POLICY}-fallback")
        hook = self.pm.hook
        self._select_batch = hook.select_batch
        self._choose_preemption = hook.choose_preemption
        self._can_allocate = hook.can_allocate
        # Everything is registered above, once: a run with no on_step implementation skips the hook call.
        self._on_step = hook.on_step if hook.on_step.get_hookimpls() else None

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

    def select_batch(self, step):
        return self._select_batch(step=step)

    def choose_preemption(self, step, requester):
        return self._choose_preemption(step=step, requester=requester)

    def can_allocate(self, step, group):
        return self._can_allocate(step=step, group=group)

    def on_step(self, report) -> None:
        if self._on_step is not None:
            self._on_step(report=report)
