"""Running a policy's hooks: the policy's contract on the plugin layer (``kvsched/plugins/``), which finds, loads and
calls plugins."""

from __future__ import annotations

import functools
import traceback
from typing import Any

from kvsched.core import hookspecs
from kvsched.core.defaults import CoreDefaults
from kvsched.errors import PolicyError, error_text, quote
from kvsched.plugins.boundary import POLICY_CAUGHT, call_hook, plugin_line
from kvsched.plugins.discovery import BUILTIN_DISTRIBUTION, load_policy, resolve_plugin
from kvsched.plugins.hooks import dispatch, invalid_plugin, plugin_manager
from kvsched.plugins.identity import engine_defaults, policy_attribute
from kvsched.plugins.options import checked_options, instantiate

DEFAULT_POLICY = "vllm-default"
HOOKS = ("select_batch", "choose_preemption", "can_allocate", "on_step")


class PolicyHooks:
    """One engine's hooks: the policy (an installed policy's name, or a class, instance or module), the core defaults
    and observers (anything with ``on_step``). ``in_hook`` names the hook running, so the core can ``refuse`` what it
    may not do; the first error of a hook call is the one it raises, even if the plugin caught it."""

    def __init__(
        self, policy: str | Any = DEFAULT_POLICY, options: dict[str, Any] | None = None, observers: tuple = ()
    ) -> None:
        policy, self.name, by_name = resolve_plugin(policy)
        self.policy = instantiate(policy, checked_options(policy, options, self.name), self.name)
        named = [(o, f"{type(o).__name__}-{i}") for i, o in enumerate(observers)]
        self._observers = [name for _, name in named]
        plugins = [(CoreDefaults(), "kvsched-core-defaults"), (self.policy, self.name), *named]
        invalid = functools.partial(invalid_plugin, hooks=HOOKS, by_name=by_name)
        self.pm = plugin_manager(hookspecs.PROJECT, hookspecs, plugins, invalid)
        if not self.pm.get_hookcallers(self.policy):
            raise PolicyError(
                self.name,
                "implements no hook: mark select_batch, choose_preemption, can_allocate or on_step with @hookimpl",
            )
        hook = self.pm.hook
        if not hook.select_batch.get_hookimpls():  # it only picks victims or admits: the built-in vllm-default builds
            builtin = f"{BUILTIN_DISTRIBUTION}:{DEFAULT_POLICY}"
            self.pm.register(instantiate(load_policy(builtin)), name=f"{DEFAULT_POLICY}-fallback")
        builders = hook.select_batch.get_hookimpls()
        # A batch builder that declares ``fcfs`` (True or False): the scheduler may repeat its steady steps.
        self.fcfs = policy_attribute(builders[0].plugin, "fcfs", False, self.name) if len(builders) == 1 else False
        if type(self.fcfs) is not bool:
            raise PolicyError(self.name, f"its fcfs is {quote(self.fcfs)}, not True or False")
        self.select_batch = self._hook("select_batch", ("step",))
        self.choose_preemption = self._hook("choose_preemption", ("step", "requester"))
        self.can_allocate = self._hook("can_allocate", ("step", "group"))
        # Without the policy's own admission rule, ``admit`` asks the block manager itself: no hook call.
        self.decides_admission = len(hook.can_allocate.get_hookimpls()) > 1
        self.observes_steps = bool(hook.on_step.get_hookimpls())  # then every step gets its report: no steady runs
        self.on_step = self._hook("on_step", ("report",), False) if self.observes_steps else lambda report: None
        self.in_hook: str | None = None
        self._first_error: PolicyError | None = None
        self._first = functools.partial(getattr, self, "_first_error")  # the call's first refusal (call_hook): no frame

    def configure(self, config):
        """``config`` with the policy's ``engine_defaults`` (vllm-v1's V1 mechanics) where the caller set none."""
        defaults = engine_defaults(self.policy, self.name)
        if not defaults:
            return config
        try:
            return type(config).model_validate({**defaults, **config.model_dump(exclude_unset=True)})
        except ValueError as exc:
            raise PolicyError(self.name, f"its engine_defaults {defaults} do not fit the config: {exc}") from exc

    def _hook(self, name: str, args: tuple[str, ...], firstresult: bool = True):
        """Hook ``name`` as a function of ``args``, called through ``_call`` (a partial: no frame of its own)."""
        return functools.partial(self._call, name, dispatch(getattr(self.pm.hook, name), args, firstresult))

    def _call(self, name: str, hook, *args):
        outer, self.in_hook = self.in_hook, name
        try:
            return call_hook(hook, args, self._first, self._failure, caught=POLICY_CAUGHT)
        finally:
            self.in_hook = outer
            if outer is None:
                self._first_error = None

    def refuse(self, message: str, hook: str | None = None) -> PolicyError:
        """The ``PolicyError`` (to raise) for what the running plugin just tried (or ``hook`` answered)."""
        return self._error(message, hook or self.in_hook, list(traceback.walk_stack(None)))

    def _failure(self, exc: BaseException) -> PolicyError:
        frames = list(traceback.walk_tb(exc.__traceback__))[::-1]
        return self._error(f"raised {type(exc).__name__}: {error_text(exc)}", self.in_hook, frames)

    def _error(self, message: str, hook: str | None, frames: list) -> PolicyError:
        """Names the plugin whose ``hook`` is on ``frames`` (innermost first) and its line; keeps a call's first."""
        hookimpls = getattr(self.pm.hook, hook).get_hookimpls() if hook else ()
        impls = {getattr(i.function, "__code__", None): i.plugin_name for i in hookimpls}
        plugin = next((impls[f.f_code] for f, _ in frames if f.f_code in impls), self.name)
        who, role = (plugin, "observer") if plugin in self._observers else (self.name, "policy")
        error = PolicyError(who, message + plugin_line(frames), hook, role)
        if hook is not None and self._first_error is None:
            self._first_error = error
        return error
