"""A point run in a worker (a process of a sweep's pool, a Ray task) fails as it fails in a single run:
with the same one line, naming the policy, its hook and its line.

What a run raises does not always survive the trip back to the command's process. A ``PolicyError``
cannot be rebuilt from the arguments pickle keeps (unpickling it broke the whole pool: "unexpected
BrokenProcessPool", no policy named), a plugin's exception may hold what pickle refuses (a lambda)
or what ``str()`` refuses (a 5,000-digit int), and Ray wraps what it cannot rebuild as an
``UnserializableException``; a ``SystemExit`` would end the whole command with no results (the
engine makes a hook's its ``PolicyError``, but not one raised elsewhere). ``portable`` turns each into
an exception that pickles, and prints in the command's process as the original prints in a single run.
"""

from __future__ import annotations

import pickle

from kvsched.errors import KvschedError, error_text


class WorkerError(KvschedError):
    """A point's failure, as the text a single run prints (its one argument: it pickles as it is)."""


def portable(exc: BaseException) -> BaseException:
    """``exc``, raised while running a point in a worker, as an exception that travels to the command's
    process and reads there as ``exc`` reads in a single run (``exc`` itself if it does). A ``SystemExit``
    or ``GeneratorExit`` ends this point only, not the command."""
    if isinstance(exc, Exception) and _travels(exc):
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


class WorkerDied(KvschedError):
    """A worker ended without an answer: a policy calling ``os._exit`` or crashing its process, or no memory left."""

    def __init__(self, running: list[str]) -> None:
        more = f" and {len(running) - 5} more" if len(running) > 5 else ""
        super().__init__(
            f"a worker ended without finishing its point (a policy ending or crashing its process, or no "
            f"memory left) while running one of: {', '.join(running[:5])}{more}"
        )
