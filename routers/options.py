"""The bounds of the built-in routers' options: a constructor given a value outside them raises a
``ValueError`` naming the option, which ``RouterHooks`` reports as the router's one-line error (from
``--router-opt``, a fleet spec's ``router_options`` or Python alike), before any request is routed."""

from __future__ import annotations

import math

from kvsched.core.config import MAX_BLOCKS
from kvsched.core.request import MAX_INT64, MAX_TOKENS
from kvsched.errors import quote


def integer(name: str, value: object, low: int, high: int) -> int:
    """``value``, an int from ``low`` to ``high``."""
    if type(value) is not int or not low <= value <= high:
        raise ValueError(f"{name} must be an integer from {low:,} to {high:,}, got {quote(value)}")
    return value


def number(name: str, value: object, low: float, high: float = math.inf) -> float:
    """``value``, a finite int or float from ``low`` to ``high``."""
    if type(value) not in (int, float) or not (math.isfinite(value) and low <= value <= high):
        upper = f" to {high:g}" if high != math.inf else ""
        raise ValueError(f"{name} must be a finite number from {low:g}{upper}, got {quote(value)}")
    return float(value)


def seed(value: object) -> int:
    return integer("seed", value, -MAX_INT64 - 1, MAX_INT64)


def block_size(value: object) -> int:
    """Tokens per block the router hashes prompts by (the replicas' own, to match their caches)."""
    return integer("block_size", value, 1, MAX_TOKENS)


def capacity(value: object) -> int:
    """Block hashes the router's table keeps per replica (at most a replica's largest GPU pool)."""
    return integer("capacity", value, 1, MAX_BLOCKS)
