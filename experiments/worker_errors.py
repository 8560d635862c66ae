"""A point run in a worker (a process of a sweep's pool, a Ray task) fails as it fails in a single run:
with the same one line, naming the policy, its hook and its line.

What a run raises does not always survive the trip back to the command's process. A ``PolicyError``
cannot be rebuilt from the arguments pickle keeps (unpickling it broke the whole pool: "unexpected
BrokenProcessPool", no policy named), a plugin's exception may hold what pickle refuses (a lambda)
or what ``str()`` refuses (a 5,000-digit int), and Ray wraps what it cannot rebuild as an
``UnserializableException``. A policy's ``SystemExit`` is re-raised by the engine as it is (an
embedding program's exit is its own), but from a worker it would end the whole command with the
policy's exit status and no results. ``portable`` turns each into an exception that pickles, and
prints in the command's process as the original prints in a single run.
"""

from __future__ import annotations

import pickle
import traceback
from pathlib import Path

from kvsched.core import plugins
from kvsched.core.errors import KvschedError, PolicyError, error_text
from kvsched.core.loading import HOOKS, _exception_text


class WorkerError(KvschedError):
    """A point's failure, as the text a single run prints (its one argument: it pickles as it is)."""


def portable(exc: BaseException, policy: str) -> BaseException:
    """``exc``, raised while running ``policy`` in a worker, as an exception that travels to the
    command's process and reads there as ``exc`` reads in a single run (``exc`` itself if it does)."""
    if not isinstance(exc, Exception):  # SystemExit, GeneratorExit: the policy's, ending its point only
        return WorkerError(str(PolicyError(_policy_name(policy), f"raised {_exception_text(exc)}", _hook(exc))))
    if _travels(exc):
        return exc
    if isinstance(exc, KvschedError):
        return WorkerError(error_text(exc, 1000))
    if isinstance(exc, (ValueError, LookupError, OSError)):  # bad input, as the CLI reads these
        return ValueError(error_text(exc, 1000))
    return RuntimeError(f"{type(exc).__name__}: {error_text(exc, 1000)}")


def _travels(exc: Exception) -> bool:
    """Whether pickle rebuilds ``exc`` as the same type with the same message."""
    try:
        copy = pickle.loads(pickle.dumps(exc))
        return type(copy) is type(exc) and str(copy) == str(exc)
    except Exception:  # pickle refused a value, or str() raised (a huge int): send text instead
        return False


def _policy_name(spec: str) -> str:
    """The policy's name as a single run's error gives it."""
    try:
        return plugins.policy_name(spec, plugins.load_policy(spec))
    except Exception:
        return spec


def _hook(exc: BaseException) -> str | None:
    """The policy hook the engine was running when ``exc`` was raised (None outside hooks)."""
    engine_side = str(Path(plugins.__file__))
    hooks = [frame.f_code.co_name for frame, _ in traceback.walk_tb(exc.__traceback__)
             if frame.f_code.co_filename == engine_side and frame.f_code.co_name in HOOKS]
    return hooks[-1] if hooks else None


class WorkerDied(KvschedError):
    """A worker ended without an answer: a policy calling ``os._exit`` or crashing its process, or no memory left."""

    def __init__(self, running: list[str]) -> None:
        more = f" and {len(running) - 5} more" if len(running) > 5 else ""
        super().__init__(f"a worker ended without finishing its point (a policy ending or crashing its process, or no "
                         f"memory left) while running one of: {', '.join(running[:5])}{more}")
