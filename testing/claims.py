"""What a policy may claim beyond the universal invariants; the suite checks exactly the claims declared.

A policy declares them as a class (or module) attribute, e.g.
``claims = frozenset({"starvation-free"})``. Unknown claim names are an error, so that a typo
cannot silently turn a check off. Claims are not inherited: a subclass that changes what a request
waits behind or which one is preempted may break its base's claim, so each class states its own
(``class Mine(VllmV1): claims = VllmV1.claims`` restates them on purpose). ``bounded-preemption``
takes its bound from the policy's ``max_preemptions_per_request``.
"""

from __future__ import annotations

from typing import Any

STARVATION_FREE = "starvation-free"
PRIORITY_PREEMPTION = "priority-preemption"
BOUNDED_PREEMPTION = "bounded-preemption"

CLAIMS = {
    STARVATION_FREE: "a request finishes while a continuous stream of more favoured requests keeps the engine "
    "overloaded",
    PRIORITY_PREEMPTION: "a preemption victim is never more urgent than the requester "
    "(the policy's urgency(step, group) if it has one, else the request priority)",
    BOUNDED_PREEMPTION: "in those overload scenarios no request is preempted more than the policy's "
    "max_preemptions_per_request times",
}


def declared_claims(policy: Any) -> frozenset[str]:
    """The claims a policy object (class, instance or module) states itself, not those of its base classes;
    raises on unknown names."""
    import inspect

    from kvsched.plugins.identity import policy_attribute  # a raising property is the policy's error, named

    cls = policy if inspect.isclass(policy) else None if inspect.ismodule(policy) else type(policy)
    own = cls is None or "claims" in vars(cls) or "claims" in getattr(policy, "__dict__", {})
    claims = (policy_attribute(policy, "claims", None) or ()) if own else ()
    if isinstance(claims, str):
        claims = (claims,)
    claims = frozenset(claims)
    unknown = claims - set(CLAIMS)
    if unknown:
        raise ValueError(f"unknown claim(s) {sorted(unknown)}; known claims: {', '.join(CLAIMS)}")
    return claims


def preemption_bound(policy: Any) -> int:
    """The ``max_preemptions_per_request`` a policy claiming ``bounded-preemption`` states (a whole number >= 0)."""
    from kvsched.plugins.identity import policy_attribute

    bound = policy_attribute(policy, "max_preemptions_per_request", None)
    if type(bound) is not int or bound < 0:
        raise ValueError(
            f"a policy claiming {BOUNDED_PREEMPTION} states max_preemptions_per_request, a whole number >= 0; "
            f"got {bound!r}"
        )
    return bound
