"""kvsched's conformance suite: check any policy (built-in or installed) against the engine's invariants.

For a policy author::

    pytest --pyargs kvsched.testing --policy my-policy       # an installed policy
    engine check --policy my-policy                          # the same checks, as a table
    engine check --router my-router                          # a router's conformance suite (testing/routers.py)

or subclass ``kvsched.testing.PolicyConformance`` in your own tests. The names below are
imported lazily, so that pytest's plugin loading (``kvsched.testing.pytest_plugin``) stays cheap.
"""

from __future__ import annotations

_EXPORTS = {
    "PolicyConformance": "kvsched.testing.base",
    "PolicyMachine": "kvsched.testing.machine",
    "run_checks": "kvsched.testing.checks",
    "CheckResult": "kvsched.testing.checks",
    "INVARIANTS": "kvsched.testing.invariants",
    "CLAIMS": "kvsched.testing.claims",
    "declared_claims": "kvsched.testing.claims",
    "resolve_policy": "kvsched.testing.resolve",
    "run_router_checks": "kvsched.testing.routers",
    "ROUTER_CHECKS": "kvsched.testing.routers",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'kvsched.testing' has no attribute {name!r}")
