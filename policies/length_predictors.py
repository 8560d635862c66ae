"""Output-length predictors for length-aware policies (``sjf``): what a scheduler believes a job's size is.

A predictor is any object with ``predict(group) -> float`` (predicted output tokens in total).
In simulation the workload knows the true length (``GroupView.expected_output_len``), so the
predictors here are the oracle and two degraded versions of it, the ones the learning-to-rank
SJF work (Fu et al., NeurIPS'24) argues are enough to study ordering quality: a noisy oracle and
a coarse bucket classifier. Requests without a known length fall back to ``max_tokens``.
"""

from __future__ import annotations

import hashlib
import math
import random
from typing import Protocol

from kvsched.core.view import GroupView


class LengthPredictor(Protocol):
    def predict(self, group: GroupView) -> float: ...


def _true_len(group: GroupView) -> int:
    known = group.expected_output_len
    return known if known is not None else group.max_tokens


class OraclePredictor:
    """The true output length: the upper bound of what any predictor can do."""

    name = "oracle"

    def predict(self, group: GroupView) -> float:
        return float(_true_len(group))


class NoisyOraclePredictor:
    """The true length times log-normal noise (``sigma`` in log space), fixed per request.

    The noise is derived from ``seed`` and the request id, so a request keeps its prediction
    across steps and runs are reproducible.
    """

    name = "noisy"

    def __init__(self, sigma: float = 0.5, seed: int = 0) -> None:
        self.sigma = float(sigma)  # options from the CLI arrive as strings
        if self.sigma < 0:
            raise ValueError(f"sigma must be >= 0, got {sigma}")
        self.seed = int(seed)

    def predict(self, group: GroupView) -> float:
        digest = hashlib.blake2b(f"{self.seed}:{group.request_id}".encode(), digest_size=8).digest()
        rng = random.Random(int.from_bytes(digest, "little"))
        return _true_len(group) * math.exp(rng.gauss(0.0, self.sigma))


class BucketedPredictor:
    """A classifier into length buckets: predicts the upper edge of the bucket the true length falls in."""

    name = "bucketed"

    def __init__(self, edges: tuple[int, ...] | str = (64, 256, 1024)) -> None:
        if isinstance(edges, str):  # from the CLI: --policy-opt edges=64,256,1024
            edges = tuple(int(e) for e in edges.split(",") if e.strip())
        edges = tuple(sorted(int(e) for e in edges))
        if not edges or edges[0] < 1:
            raise ValueError(f"bucket edges must be positive integers, got {edges}")
        self.edges = edges

    def predict(self, group: GroupView) -> float:
        n = _true_len(group)
        for edge in self.edges:
            if n <= edge:
                return float(edge)
        return float(self.edges[-1] * 2)  # the open top bucket: known only to be long


PREDICTORS = {"oracle": OraclePredictor, "noisy": NoisyOraclePredictor, "bucketed": BucketedPredictor}


def make_predictor(spec: str | LengthPredictor, **options) -> LengthPredictor:
    """A predictor from its name (with options) or an object that already has ``predict``."""
    if not isinstance(spec, str):
        if not callable(getattr(spec, "predict", None)):
            raise TypeError(f"a length predictor needs a predict(group) method, got {spec!r}")
        return spec
    if spec not in PREDICTORS:
        raise ValueError(f"unknown length predictor {spec!r}; available: {', '.join(PREDICTORS)}")
    return PREDICTORS[spec](**options)
