"""Running a policy's hooks (``PolicyHooks``): the chosen policy plus the core defaults, on pluggy. Finding,
loading and calling a plugin is the plugin layer's (``kvsched/plugins/``); what is the policy's contract is here."""

from __future__ import annotations

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
SELECT_BATCH, CHOOSE_PREEMPTION, CAN_ALLOCATE, ON_STEP = "select_batch", "choose_preemption", "can_allocate", "on_step"
HOOKS = (SELECT_BATCH, CHOOSE_PREEMPTION, CAN_ALLOCATE, ON_STEP)


class PolicyHooks:
    """One engine's plugin manager: the policy (an installed policy's name, or a class, instance or module), the core
    defaults and observers (anything with ``on_step``; they never decide). It runs the hooks: ``in_hook`` names the one
    running (so the core can ``refuse`` what it may not do), an exception becomes a ``PolicyError`` naming plugin, hook
    and line, and the first error of a hook call is the one it raises, even if the plugin caught it."""

    def __init__(
        self, policy: str | Any = DEFAULT_POLICY, options: dict[str, Any] | None = None, observers: tuple = ()
    ) -> None:
        # chosen by name: an installed policy, as the user knows it
        policy, self.name, self._chosen_by_name = resolve_plugin(policy)
        self.policy = instantiate(policy, checked_options(policy, options, self.name), self.name)
        named = [(o, f"{type(o).__name__}-{i}") for i, o in enumerate(observers)]
        self._observers = [name for _, name in named]
        plugins = [(CoreDefaults(), "kvsched-core-defaults"), (self.policy, self.name), *named]
        self.pm = plugin_manager(hookspecs.PROJECT, hookspecs, plugins, self._invalid)
        if not self.pm.get_hookcallers(self.policy):
            raise PolicyError(
                self.name,
                "implements no hook: mark select_batch, choose_preemption, can_allocate or on_step with @hookimpl",
            )
        if not self.pm.hook.select_batch.get_hookimpls():  # a policy that only picks victims or admits
            builtin = f"{BUILTIN_DISTRIBUTION}:{DEFAULT_POLICY}"  # never another distribution's vllm-default
            self.pm.register(instantiate(load_policy(builtin)), name=f"{DEFAULT_POLICY}-fallback")
        hook = self.pm.hook
        builders = hook.select_batch.get_hookimpls()
        # A batch builder that declares ``fcfs`` (True or False): the scheduler may repeat its steady steps.
        self.fcfs = policy_attribute(builders[0].plugin, "fcfs", False, self.name) if len(builders) == 1 else False
        if type(self.fcfs) is not bool:
            raise PolicyError(self.name, f"its fcfs is {quote(self.fcfs)}, not True or False")
        self._select_batch = dispatch(hook.select_batch, ("step",))
        self._choose_preemption = dispatch(hook.choose_preemption, ("step", "requester"))
        self._can_allocate = dispatch(hook.can_allocate, ("step", "group"))
        # No admission rule of the policy's: ``admit`` asks the block manager itself, saving a hook call per admission.
        self.decides_admission = len(hook.can_allocate.get_hookimpls()) > 1
        # Everything is registered above, once: a run with no on_step implementation skips the hook call.
        self._on_step = dispatch(hook.on_step, ("report",), firstresult=False) if hook.on_step.get_hookimpls() else None
        self.observes_steps = self._on_step is not None  # then every step gets its report: no steady runs
        self.in_hook: str | None = None
        self._first_error: PolicyError | None = None
        self._first = lambda: self._first_error  # the hook call's first refusal (call_hook)

    def _invalid(self, pm, exc, plugin: Any, name: str) -> PolicyError:
        return invalid_plugin(pm, exc, plugin, name, HOOKS, self._chosen_by_name)

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
        """What the running hook raised, as its ``PolicyError``."""
        frames = list(traceback.walk_tb(exc.__traceback__))[::-1]
        return self._error(f"raised {type(exc).__name__}: {error_text(exc)}", self.in_hook, frames)

    def _error(self, message: str, hook: str | None, frames: list) -> PolicyError:
        """Name the plugin whose implementation of ``hook`` is on ``frames`` ((frame, line), innermost
        first) and the innermost line of plugin code; keep the first error of a hook call."""
        hookimpls = getattr(self.pm.hook, hook).get_hookimpls() if hook else ()
        impls = {getattr(i.function, "__code__", None): i.plugin_name for i in hookimpls}
        plugin = next((impls[f.f_code] for f, _ in frames if f.f_code in impls), self.name)
        observer = plugin in self._observers
        error = PolicyError(
            plugin if observer else self.name,
            message + plugin_line(frames),
            hook,
            "observer" if observer else "policy",
        )
        if hook is not None and self._first_error is None:
            self._first_error = error
        return error
