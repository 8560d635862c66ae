"""What a policy may claim beyond the universal invariants; the suite checks exactly the claims declared.

A policy declares them as a class (or module) attribute, e.g.
``claims = frozenset({"starvation-free"})``. Unknown claim names are an error, so that a typo
cannot silently turn a check off.
"""

from __future__ import annotations

from typing import Any

STARVATION_FREE = "starvation-free"
PRIORITY_PREEMPTION = "priority-preemption"

CLAIMS = {
    STARVATION_FREE: "a request finishes while a continuous stream of more favoured requests keeps the engine overloaded",
    PRIORITY_PREEMPTION: "a preemption victim is never more urgent than the requester "
    "(the policy's urgency(step, group) if it has one, else the request priority)",
}


def declared_claims(policy: Any) -> frozenset[str]:
    """The claims of a policy object (class, instance or module); raises on unknown names."""
    from kvsched.core.plugins import policy_attribute  # a raising property is the policy's error, named

    claims = policy_attribute(policy, "claims", None) or ()
    if isinstance(claims, str):
        claims = (claims,)
    claims = frozenset(claims)
    unknown = claims - set(CLAIMS)
    if unknown:
        raise ValueError(f"unknown claim(s) {sorted(unknown)}; known claims: {', '.join(CLAIMS)}")
    return claims
