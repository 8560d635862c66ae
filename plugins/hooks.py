"""A plugin's hooks on pluggy, for policies and routers alike: their plugin manager (``plugin_manager``), each hook
as a plain call of its implementations (``dispatch``), and pluggy's complaint about an implementation as one line
naming the function and its line."""

from __future__ import annotations

import inspect
import os
import re
from typing import Any

import pluggy

from kvsched.errors import PolicyError
from kvsched.plugins.boundary import guarded
from kvsched.plugins.identity import identity, own_name


def plugin_manager(project: str, specs: Any, plugins, invalid) -> pluggy.PluginManager:
    """A pluggy manager of the hooks ``specs`` declares, with ``plugins`` ((plugin, name) pairs; the last is called
    first) registered: pluggy reads their attributes and markers (plugin code) and checks each hook implementation
    against its spec; what fails names the plugin; pluggy's complaint is ``invalid(pm, complaint, plugin, name)``."""
    pm = pluggy.PluginManager(project)
    pm.add_hookspecs(specs)
    for plugin, name in plugins:
        try:
            guarded(name, identity(plugin, name)[1], "registering it fails", pm.register, plugin, name=name)
        except PolicyError as exc:
            cause = exc.__cause__
            if isinstance(cause, pluggy.PluginValidationError):
                raise invalid(pm, cause, plugin, name) from cause
            if isinstance(cause, ValueError) and "already registered" in str(cause):
                raise PolicyError(name, f"invalid plugin: {cause}") from cause
            raise
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:  # named as registered (by identity: == would be plugin code)
        name = next((n for n, p in pm.list_name_plugin() if p is exc.plugin), type(exc.plugin).__name__)
        raise invalid(pm, exc, exc.plugin, name) from exc
    return pm


def dispatch(caller: pluggy.HookCaller, names: tuple[str, ...], firstresult: bool = True):
    """A function of the hook's arguments (``names``, in order) that calls its implementations as
    pluggy does, newest first, up to the first result that is not None (``firstresult``), without
    pluggy's per-call bookkeeping (a good part of a step's cost). pluggy's own call when a wrapper
    or an implementation taking other arguments is registered."""
    impls = caller.get_hookimpls()
    if any(i.hookwrapper or i.wrapper or i.kwargnames or i.argnames not in (names, ()) for i in impls):
        return lambda *args: caller(**dict(zip(names, args)))
    chain = [(i.function, bool(i.argnames)) for i in reversed(impls)]
    if firstresult and len(chain) == 1 and chain[0][1]:  # its one implementation's answer is the call's
        return chain[0][0]

    def call(*args):
        for function, takes_args in chain:
            result = function(*args) if takes_args else function()
            if firstresult and result is not None:
                return result
        return None

    return call


def invalid_plugin(
    pm: pluggy.PluginManager, exc: pluggy.PluginValidationError, plugin: Any, name: str, hooks: tuple, by_name: bool
) -> PolicyError:
    """pluggy's complaint about one hook implementation of ``plugin`` (``hooks``: the names a plugin may implement),
    on one line, blamed on the class that defines it (not a name it inherits; ``name`` where the plugin was chosen
    ``by_name``), at the line where it does."""
    reason = str(exc).splitlines()
    hook = re.search(r"hook '(\w+)'", reason[0])
    function = _hookimpl_function(pm, plugin, hook.group(1)) if hook else None
    if function is None:
        return PolicyError(name, "invalid plugin: " + "; ".join(reason))
    code = getattr(function, "__code__", None)
    where = f" (at {code.co_filename.removeprefix(os.getcwd() + os.sep)}:{code.co_firstlineno})" if code else ""
    qualname = getattr(function, "__qualname__", hook.group(1))
    owner = _defining_class(plugin, getattr(function, "__func__", function))
    culprit = name if by_name or owner is None else own_name(owner) or owner.__qualname__
    why = (
        reason[-1]
        if reason[0].startswith("Plugin")
        else f"kvsched has no hook {hook.group(1)!r} (hooks: {', '.join(hooks)})"
    )
    return PolicyError(culprit, f"invalid plugin: {qualname}{_signature(function)}{where}: {why}")


def _hookimpl_function(pm: pluggy.PluginManager, plugin: Any, hook: str) -> Any:
    """The function ``plugin`` marks as its implementation of ``hook`` (None if it cannot be told)."""
    try:
        for attr in dir(plugin):
            opts = pm.parse_hookimpl_opts(plugin, attr)
            if opts is not None and (opts.get("specname") or attr) == hook:
                return inspect.unwrap(getattr(plugin, attr))
    except Exception:
        return None
    return None


def _defining_class(plugin: Any, function: Any) -> type | None:
    """The class in ``plugin``'s MRO whose own body defines ``function``."""
    classes = plugin.__mro__ if inspect.isclass(plugin) else type(plugin).__mro__
    for cls in classes:
        for value in vars(cls).values():
            if inspect.unwrap(getattr(value, "__func__", value)) is function:
                return cls
    return None


def _signature(function: Any) -> str:
    try:
        return str(inspect.signature(function))
    except (TypeError, ValueError):
        return "(...)"
