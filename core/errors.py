"""Errors a user or a plugin author can act on; the CLI prints them as one line."""


class KvschedError(Exception):
    """Base of every error the CLI reports without a traceback."""


class PolicyError(KvschedError):
    """A policy returned an invalid decision or raised; the engine state is left as it was."""

    def __init__(self, policy: str, message: str) -> None:
        super().__init__(f"policy {policy!r}: {message}")
        self.policy = policy


class UnknownPolicyError(KvschedError, LookupError):
    """No installed policy has the requested name."""


class StallError(KvschedError):
    """The engine made no progress for too long although requests are pending."""


class AuditError(KvschedError):
    """An allocator invariant does not hold (a bug in the core, never a policy's doing)."""
