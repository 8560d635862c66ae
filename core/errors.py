"""Errors a user or a plugin author can act on; the CLI prints them as one line."""

import reprlib

_QUOTE = reprlib.Repr()  # its keyword arguments are Python 3.12's
_QUOTE.maxlevel, _QUOTE.maxtuple, _QUOTE.maxlist, _QUOTE.maxdict, _QUOTE.maxset = 2, 4, 4, 4, 4
_QUOTE.maxstring, _QUOTE.maxother, _QUOTE.maxlong = 60, 60, 40


def quote(value: object) -> str:
    """``repr(value)``, cut short: an error line quotes a bad value, never megabytes of it."""
    return _QUOTE.repr(value)


def shorten(text: str, limit: int = 200) -> str:
    """``text`` cut to about ``limit`` characters, saying how much was left out."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit:,} more characters)"


class KvschedError(Exception):
    """Base of every error the CLI reports without a traceback."""


class PolicyError(KvschedError):
    """A plugin decided something invalid, misused the engine or raised; the step it was building left no trace.
    ``policy`` names the plugin, ``hook`` the hook it was running in (None outside hooks)."""

    def __init__(self, policy: str, message: str, hook: str | None = None, role: str = "policy") -> None:
        super().__init__(f"{role} {policy!r}" + (f" in {hook}" if hook else "") + f": {message}")
        self.policy, self.hook = policy, hook


class UnknownPolicyError(KvschedError, LookupError):
    """No installed policy has the requested name."""


class StallError(KvschedError):
    """The engine made no progress for too long although requests are pending."""


class AuditError(KvschedError):
    """An allocator invariant does not hold (a bug in the core, never a policy's doing)."""
