"""Turn what a user typed after ``--policy`` into a policy object (``kvsched.plugins.discovery.load_policy``)."""

from __future__ import annotations

from typing import Any

from kvsched.plugins.discovery import load_policy, policy_name


def resolve_policy(spec: str) -> tuple[str, Any]:
    """``(display name, policy object)`` for an entry-point name, ``file.py:Attr`` or ``module:Attr``."""
    policy = load_policy(spec)
    return (policy_name(spec, policy) if ":" in spec else spec), policy
