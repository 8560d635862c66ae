"""Finding plugins: the entry points policies (``kvsched.policies``) and routers (``kvsched.routers``) are
registered under, read from package metadata, and loading one by its name, ``DIST:NAME`` (where several
distributions register the name), ``path/to/file.py:Attr`` or ``module:Attr``.

Loading runs plugin code (the import, attribute reads): each step goes through ``guarded``, so that whatever a
plugin raises there, SystemExit included, becomes a one-line ``PolicyError`` naming it and where it comes from.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

from kvsched.errors import KvschedError, PolicyError, UnknownPolicyError, quote, type_name
from kvsched.plugins.boundary import from_origin, guarded
from kvsched.plugins.identity import declared_name, identity, own_name, remember

GROUPS = {
    "policy": "kvsched.policies",
    "router": "kvsched.routers",
    "mechanics": "kvsched.mechanics",
}  # the kinds of plugin, and where each is registered
BUILTIN_DISTRIBUTION = "kvsched"


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
        raise PolicyError(spec, f"is {quote(policy)}, not a {kind} class, instance or module{from_origin(origin)}")
    remember(policy, spec, origin)
    declared_name(policy)  # a name of the wrong type is refused however the policy is chosen
    if found is None:
        remember(policy, policy_name(spec, policy, kind), origin)
    return policy


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


def policy_name(spec: str, policy: Any, kind: str = "policy") -> str:
    """How a policy given as ``spec`` is named in messages: an installed policy by what the user typed
    (``NAME`` or ``DIST:NAME``), a file's or module's by the ``name`` it declares itself, else by the
    attribute's (a draft subclass of ``vllm-default`` is not ``vllm-default``)."""
    target, colon, attr = spec.rpartition(":")
    if not colon or (not target.endswith(".py") and _of_distribution(target, attr, kind) is not None):
        return spec
    return own_name(policy) or attr
