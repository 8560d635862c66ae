"""``sjf``: shortest predicted job first, with a pluggable length predictor and a starvation guard."""

from __future__ import annotations

from kvsched.core.hookspecs import hookimpl
from kvsched.policies.continuous import ContinuousBatching
from kvsched.policies.length_predictors import make_predictor


class Sjf(ContinuousBatching):
    """Shortest predicted job first (remaining output tokens), oldest first once a request waited too long.

    Admission offers waiting groups in order of predicted remaining output (``predictor``:
    ``history`` with ``window``, the default and the one a server could run; the oracles ``oracle``,
    ``noisy`` with ``sigma``, ``bucketed`` with ``edges``; or any object with ``predict`` and a ``name``;
    policies/length_predictors.py; the run's summary names it). The guard: a request whose age (now −
    arrival) exceeds ``starvation_s`` seconds jumps ahead of every non-starving one, oldest first, and is not picked as
    a victim while another candidate exists. Short of blocks, the running group with the longest predicted
    remaining work is preempted (SRPT), the newest among equals.
    """

    name = "sjf"
    claims = frozenset({"starvation-free"})

    def __init__(
        self,
        predictor="history",
        starvation_s: float = 10.0,
        sigma: float | None = None,
        edges: str | tuple[int, ...] | None = None,
        window: int | None = None,
        seed: int = 0,
    ) -> None:
        options = {k: v for k, v in (("sigma", sigma), ("edges", edges), ("window", window)) if v is not None}
        if predictor == "noisy":
            options["seed"] = seed
        self.predictor = make_predictor(predictor, **options)
        self.length_predictor = self.predictor.name  # what the run's summary says this policy knew
        self.starvation_s = starvation_s
        if starvation_s <= 0:
            raise ValueError(f"starvation_s must be > 0, got {starvation_s}")

    def remaining(self, group) -> float:
        return max(self.predictor.predict(group) - group.num_generated_tokens / max(group.num_seqs, 1), 1.0)

    def starving(self, step, group) -> bool:
        return step.now - group.arrival_time > self.starvation_s

    def order_waiting(self, step):
        return sorted(
            step.waiting,
            key=lambda g: (
                not self.starving(step, g),
                0.0 if self.starving(step, g) else self.remaining(g),
                g.arrival_time,
            ),
        )

    def pick_victim(self, step, candidates, requester):
        index = {id(g): i for i, g in enumerate(step.running)}
        return max(candidates, key=lambda g: (not self.starving(step, g), self.remaining(g), index[id(g)]))

    @hookimpl
    def on_step(self, report):
        observe = getattr(self.predictor, "observe", None)
        if observe is not None:
            for group in report.finished:
                observe(group)
