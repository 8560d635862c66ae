"""Output-length predictors for length-aware policies (``sjf``): what a scheduler believes a job's size is.

vLLM's scheduler does not know how long an answer will be: a view shows the cap the client sent
(``max_tokens``, workloads/caps.py), not the answer's length. A policy that wants a length asks a
predictor, chosen by name, and the run's summary names it (``length_predictor``), so a result
obtained by knowing the future says so:

- ``history`` (realistic): the mean output of the last ``window`` finished requests, never more
  than the request's cap; the cap itself until a request has finished. It learns only what a
  server learns: finished answers (``observe``).
- ``oracle``: the true length, known in simulation only (``core.view.true_output_len``): the
  upper bound of what any predictor can do.
- ``noisy``: the true length times log-normal noise, and ``bucketed``: the upper edge of the
  bucket the true length falls in, the degraded oracles the learning-to-rank SJF work (Fu et al.,
  NeurIPS'24) argues are enough to study ordering quality.

Where no true length exists (a real model's run) the oracles fall back on ``max_tokens``.
A predictor is any object with ``predict(group) -> float`` (predicted output tokens in total) and a
``name``; ``observe(group)``, if it has one, is told of each finished request.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import deque
from typing import Protocol

from kvsched.core.view import GroupView, true_output_len


class LengthPredictor(Protocol):
    name: str

    def predict(self, group: GroupView) -> float: ...


def _true_len(group: GroupView) -> int:
    known = true_output_len(group)
    return known if known is not None else group.max_tokens


class HistoryPredictor:
    """The mean output length of the last ``window`` finished requests, at most the request's cap."""

    def __init__(self, window: int = 64) -> None:
        self.window = window
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.recent: deque[int] = deque(maxlen=self.window)
        self.name = f"history(window={self.window})"

    def observe(self, group: GroupView) -> None:
        """A finished request's answer: what each of its sequences generated, on average."""
        self.recent.append(group.num_generated_tokens // group.request.sampling.n)

    def predict(self, group: GroupView) -> float:
        if not self.recent:
            return float(group.max_tokens)
        return float(min(sum(self.recent) / len(self.recent), group.max_tokens))


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

    def __init__(self, sigma: float = 0.5, seed: int = 0) -> None:
        self.sigma, self.seed = sigma, seed
        if sigma < 0:
            raise ValueError(f"sigma must be >= 0, got {sigma}")
        self.name = f"noisy oracle(sigma={self.sigma:g})"

    def predict(self, group: GroupView) -> float:
        digest = hashlib.blake2b(f"{self.seed}:{group.request_id}".encode(), digest_size=8).digest()
        rng = random.Random(int.from_bytes(digest, "little"))
        return _true_len(group) * math.exp(rng.gauss(0.0, self.sigma))


class BucketedPredictor:
    """A classifier into length buckets: predicts the upper edge of the bucket the true length falls in."""

    def __init__(self, edges: tuple[int, ...] | str = (64, 256, 1024)) -> None:
        if isinstance(edges, str):  # as --policy-opt edges=64,256,1024 gives them
            edges = (int(e) for e in edges.split(",") if e.strip())
        edges = tuple(sorted(edges))
        if not edges or edges[0] < 1:
            raise ValueError(f"bucket edges must be positive integers, got {edges}")
        self.edges = edges
        self.name = f"bucketed oracle(edges={','.join(map(str, edges))})"

    def predict(self, group: GroupView) -> float:
        n = _true_len(group)
        for edge in self.edges:
            if n <= edge:
                return float(edge)
        return float(self.edges[-1] * 2)  # the open top bucket: known only to be long


PREDICTORS = {
    "history": HistoryPredictor,
    "oracle": OraclePredictor,
    "noisy": NoisyOraclePredictor,
    "bucketed": BucketedPredictor,
}


def make_predictor(spec: str | LengthPredictor, **options) -> LengthPredictor:
    """A predictor from its name (with options) or an object that already has ``predict`` (and a ``name``)."""
    if not isinstance(spec, str):
        if not callable(getattr(spec, "predict", None)):
            raise TypeError(f"a length predictor needs a predict(group) method, got {spec!r}")
        if not isinstance(getattr(spec, "name", None), str):
            raise TypeError(f"a length predictor needs a name (a string: the results show it), got {spec!r}")
        return spec
    if spec not in PREDICTORS:
        raise ValueError(f"unknown length predictor {spec!r}; available: {', '.join(PREDICTORS)}")
    return PREDICTORS[spec](**options)
