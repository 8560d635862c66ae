"""Errors a user or a plugin author can act on; the CLI prints them as one line.

Formatting an error never raises, whatever a plugin handed over: ``quote`` bounds what it shows of a value (an int
past Python's 4,300-digit ``str()`` limit, a ``__repr__`` that raises, a lone surrogate, which no UTF-8 terminal or
file can take), and ``error_text`` does the same for an exception's message.
"""

import math
import reprlib


class _Quote(reprlib.Repr):
    """``reprlib.Repr`` that also bounds ints: a huge one is described by its length, never converted."""

    def repr_int(self, x, level):
        if x.bit_length() <= 4 * self.maxlong:  # at most about 1.2 * maxlong digits: cheap to print and cut
            return super().repr_int(x, level)
        return f"<{'negative ' if x < 0 else ''}int of {int(math.log10(abs(x))) + 1:,} digits>"


_QUOTE = _Quote()  # its keyword arguments are Python 3.12's
_QUOTE.maxlevel, _QUOTE.maxtuple, _QUOTE.maxlist, _QUOTE.maxdict, _QUOTE.maxset = 2, 4, 4, 4, 4
_QUOTE.maxstring, _QUOTE.maxother, _QUOTE.maxlong = 60, 60, 40


def printable(text: str) -> str:
    """``text`` as UTF-8 can carry it: a lone surrogate becomes its escape (``\\udc80``)."""
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def type_name(value: object) -> str:
    try:
        return printable(str(type(value).__name__))
    except Exception:  # a metaclass that makes even the name raise
        return "object"


def quote(value: object) -> str:
    """``repr(value)``, cut short: an error line quotes a bad value, never megabytes of it, and never fails."""
    try:
        text = _QUOTE.repr(value)
        if type(text) is not str:
            raise TypeError("repr() did not give a str")
    except Exception as exc:
        return f"<{type_name(value)} whose repr() raised {type_name(exc)}>"
    return printable(text)


def shorten(text: str, limit: int = 200) -> str:
    """``text`` cut to about ``limit`` characters, saying how much was left out (and printable, as ``printable``)."""
    text = printable(text)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit:,} more characters)"


def error_text(exc: BaseException, limit: int = 200) -> str:
    """``str(exc)`` shortened; where that raises (an argument of ``str()``-refusing size, a broken
    ``__str__``), the exception's arguments quoted instead."""
    try:
        text = str(exc)
        if type(text) is not str:
            raise TypeError("str() did not give a str")
    except Exception:
        try:
            args = exc.args
            text = (", ".join(quote(arg) for arg in args) if type(args) is tuple else quote(args)) or None
        except Exception:  # args itself raised (a property)
            text = None
        text = text or f"<{type_name(exc)} whose str() raised>"
    return shorten(text, limit)


class KvschedError(Exception):
    """Base of every error the CLI reports without a traceback."""


class PolicyError(KvschedError):
    """A plugin decided something invalid, misused the engine or raised; the step it was building left no trace.
    ``policy`` names the plugin, ``hook`` the hook it was running in (None outside hooks), ``message`` says what."""

    def __init__(self, policy: str, message: str, hook: str | None = None, role: str = "policy") -> None:
        super().__init__(
            f"{role} {shorten(repr(policy), 300)}" + (f" in {hook}" if hook else "") + f": {printable(message)}"
        )
        self.policy, self.hook, self.message = policy, hook, message


class UnknownPolicyError(KvschedError, LookupError):
    """No installed policy has the requested name."""


class StallError(KvschedError):
    """The engine made no progress for too long although requests are pending."""


class AuditError(KvschedError):
    """An allocator invariant does not hold (a bug in the core, never a policy's doing)."""
