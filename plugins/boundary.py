"""The one boundary between the engine and plugin code: a hook's call, and its failure as one line.

Whatever a policy's or a router's code raises (SystemExit and GeneratorExit included; KeyboardInterrupt
is the user's and passes) becomes one error naming the plugin, the hook and the plugin's own line,
never a traceback: the file and line are those of the innermost frame outside the engine, pluggy and
Python's own library.
"""

from __future__ import annotations

import os
import sysconfig
import traceback
from typing import Any

import pluggy

from kvsched.errors import PolicyError, error_text, type_name

# Frames in these files are the engine's (the core, the allocators, this layer), pluggy's or Python's own, never a
# plugin's. The engine's packages are named by their folders: this layer sits below the core and imports none of it.
_KVSCHED = os.path.dirname(os.path.dirname(__file__))
_ENGINE_FILES = (
    os.path.dirname(pluggy.__file__) + os.sep,
    *(os.path.join(_KVSCHED, package) + os.sep for package in ("core", "allocators", "plugins")),
)
_STDLIB, _SITE = sysconfig.get_paths()["stdlib"], (sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"])


# What a policy's hook call turns into its PolicyError: a BaseException of the plugin's own escapes it, as the
# vLLM integration's last line of defence expects (it hands the server to vLLM's scheduler: vllm-integration.md).
POLICY_CAUGHT = (Exception, SystemExit, GeneratorExit)


def call_hook(hook, args: tuple, first, failure, own: type[PolicyError] = PolicyError, caught=BaseException) -> Any:
    """``hook(*args)``, the one boundary of a plugin's hook call (policy or router): what it raises of ``caught``
    but KeyboardInterrupt is ``failure(exc)``, naming plugin, hook and line, unless one of ours (``own``); the call's
    first refusal (``first()``) is raised in its place, and after the call returns, even if the plugin caught it."""
    try:
        result = hook(*args)
    except KeyboardInterrupt:
        raise
    except caught as exc:
        error = first() or (exc if isinstance(exc, own) else failure(exc))
        if error is exc:
            raise
        raise error from exc
    refused = first()
    if refused is not None:
        raise refused
    return result


def guarded(who: str, origin: str, doing: str, call, *args, **kwargs) -> Any:
    """``call(*args, **kwargs)``: plugin code. Anything it raises but KeyboardInterrupt (SystemExit,
    GeneratorExit, a PolicyError of its own too) becomes one ``PolicyError`` naming the plugin
    (``who``, from ``origin``), what failed (``doing``) and the plugin's line."""
    failure = lambda exc: PolicyError(who, f"{doing}: {exception_text(exc)}{from_origin(origin)}")  # noqa: E731
    return call_hook(lambda: call(*args, **kwargs), (), lambda: None, failure, ())


def from_origin(origin: str) -> str:
    """`` (from ORIGIN)`` at the end of a message about a plugin, where it is known where the plugin comes from."""
    return f" (from {origin})" if origin else ""


def exception_text(exc: BaseException, skip: tuple[str, ...] = ()) -> str:
    """``Type: message (at file:line)`` on one line, even when the exception's own ``__str__`` raises
    (the line: of the innermost frame of plugin code, files in ``skip`` aside)."""
    text, name = " ".join(error_text(exc).split()), type_name(exc)
    frames = [frame for frame in traceback.walk_tb(exc.__traceback__) if frame[0].f_code.co_filename not in skip][::-1]
    return f"{name}: {text}{plugin_line(frames)}" if text else f"{name}{plugin_line(frames)}"


def plugin_line(frames) -> str:
    """`` (at file:line)`` of the innermost frame of plugin code: not the engine's, pluggy's or Python's own."""
    for frame, line in frames:
        path = frame.f_code.co_filename
        if not path.startswith((*_ENGINE_FILES, "<frozen ")) and (
            not path.startswith(_STDLIB) or path.startswith(_SITE)
        ):
            return f" (at {path.removeprefix(os.getcwd() + os.sep)}:{line})"
    return ""
