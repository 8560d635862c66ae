"""Fitting a GPU's efficiencies (``Efficiency``) to real runs recorded in inference-perf result folders.

The roofline gives a step's time from the model and the datasheet, up to the few numbers no
datasheet gives: the achieved shares of peak FLOP/s and bandwidth, the all-reduce latency, the
per-step, per-layer and per-request overheads, and the serving stack's time outside the engine.
They are fitted to what the client measured (each stage's E2E latency and TTFT, mean, p90 and p99;
ITL follows from E2E through the client's token counts and adds nothing to fit), by rounds:

1. each run is simulated with the current efficiencies, and its steps recorded (``Tape``: each
   step's shape, which steps gave each request its first and last token);
2. the efficiencies are fitted on the tapes (Nelder-Mead on pseudo-Huber log errors, plus a light pull
   of each towards its prior, which settles what the runs cannot tell apart): a candidate
   re-times the recorded steps (``step_time`` over all of them at once) and the requests with
   them, as if each step had run the same batch (within a stage, steps run back to back except
   where the engine waited for an arrival);
3. repeated with the fitted values, until the batches the simulation forms agree with the times it
   charges (two rounds suffice here: the runs this fits are below saturation).

Runs in overload (a tenth of a stage's requests failed, or its mean TTFT is seconds: ``in_overload``)
are left out of the fit, as BLIS leaves them out: their latencies are queueing, which the re-timing
cannot follow; they are predicted, not fitted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from kvsched.executors.hardware import Efficiency
from kvsched.executors.roofline import RooflineProfile, step_time
from kvsched.executors.step_work import AttentionWork
from kvsched.experiments.validation import Experiment, validate

FIELDS = (
    "flops_share",
    "attention_flops_share",
    "bandwidth_share",
    "allreduce_us",
    "step_ms",
    "layer_us",
    "request_us",
    "api_ms",
    "response_ms",
)
SHARES = {"flops_share", "attention_flops_share", "bandwidth_share"}
FITTED = (("e2e", "request_latency"), ("ttft", "time_to_first_token"))
WEIGHTS = {"mean": 1.0, "p90": 0.5, "p99": 0.25}
HUBER = 0.2  # log errors past about 20 % count linearly, not squared: a run's warm-up outliers do not steer the fit
# pulls each parameter (in log or logit space) towards its prior: what the runs cannot tell apart stays put
PRIOR_WEIGHT = 0.01
# Where every fit starts: round numbers of the kind BLIS's roofline uses, not fitted to anything.
PRIORS = Efficiency(
    flops_share=0.6,
    attention_flops_share=0.4,
    bandwidth_share=0.8,
    allreduce_us=10.0,
    step_ms=1.0,
    layer_us=10.0,
    request_us=20.0,
    api_ms=10.0,
    response_ms=2.0,
    fitted_on="",
)


OVERLOAD_TTFT_S = 5.0  # a stage whose mean TTFT passes this is queueing, not computing


def in_overload(experiment: Experiment) -> bool:
    """Whether a run is in overload: a stage with a tenth of its requests failed, or a mean TTFT of seconds."""
    for name in experiment.stages:
        report = experiment.recorded[name]
        ok, failed = report["successes"]["count"], report["failures"]["count"]
        ttft = report["successes"]["latency"]["time_to_first_token"]["mean"]
        if failed >= 0.1 * (ok + failed) or ttft > OVERLOAD_TTFT_S:
            return True
    return False


class _Tap:
    """A roofline profile that records each step's shape and time as the simulator charges it."""

    def __init__(self, profile: RooflineProfile) -> None:
        self.profile, self.shapes, self.times = profile, [], []

    def __getattr__(self, name):
        return getattr(self.profile, name)

    def step_seconds(self, out, block_size: int) -> float:
        p = self.profile
        if not (out.prefill_tokens or out.decode_seqs or out.blocks_to_swap_in or out.blocks_to_swap_out):
            self.shapes.append(None)
            self.times.append(0.0)
            return 0.0
        seconds = p.step_seconds(out, block_size)
        shape = p.step_shape(out)
        self.shapes.append((shape.tokens, shape.requests, *shape.full, *shape.windowed))
        self.times.append(seconds)
        return seconds


@dataclass
class Tape:
    """One run simulated, frozen for re-timing: its steps, and which of them each request lived through."""

    experiment: Experiment
    sizes: dict[str, float]
    shape: np.ndarray  # per step: tokens, requests, the full and windowed attention work (0 for a step with none)
    extra: np.ndarray  # per step: its time beyond the profile's (the scheduler's, the idle charge)
    stage: np.ndarray  # per answered request
    wait: np.ndarray  # from its arrival to the start of the step that admitted it
    admitted: np.ndarray  # step index of its admission
    first: np.ndarray  # step index of its first token
    last: np.ndarray  # step index of its last token
    recorded: dict[int, dict] = field(repr=False, default_factory=dict)  # stage: its recorded successes
    queued: frozenset[int] = frozenset()  # stages the simulation ran in a queue the real run did not have: not fitted
    base: np.ndarray | None = field(repr=False, default=None)  # each step's time as recorded

    def durations(self, e: Efficiency) -> np.ndarray:
        s = self.shape
        full, windowed = AttentionWork(s[:, 2], s[:, 3], s[:, 4]), AttentionWork(s[:, 5], s[:, 6], s[:, 7])
        exec_s = np.where(s[:, 0] > 0, step_time(self.sizes, e, s[:, 0], s[:, 1], full, windowed, np.maximum), 0.0)
        return exec_s + self.extra

    def retime(self, e: Efficiency) -> dict[int, dict[str, np.ndarray]]:
        """Each stage's E2E and TTFT per request, as if each step had run the same batch in ``e``'s time: a request
        takes the steps it lived through, and its wait for admission scales as the step it waited through."""
        d = self.durations(e)
        total = np.concatenate(([0.0], np.cumsum(d)))  # total[k]: the time of the steps before step k
        before = np.maximum(self.admitted - 1, 0)
        base = self.base if self.base is not None else d
        wait = self.wait * np.divide(d[before], base[before], out=np.ones(len(before)), where=base[before] > 0)
        api, response = e.api_ms / 1000.0, e.response_ms / 1000.0
        ttft = api + wait + total[self.first + 1] - total[self.admitted]
        e2e = api + wait + total[self.last + 1] - total[self.admitted] + response
        return {int(st): {"ttft": ttft[self.stage == st], "e2e": e2e[self.stage == st]} for st in np.unique(self.stage)}

    def loss(self, e: Efficiency) -> float:
        total = 0.0
        for st, values in self.retime(e).items():
            if st in self.queued:
                continue
            real = self.recorded[st]["latency"]
            for metric, key in FITTED:
                v = values[metric]
                for stat, weight in WEIGHTS.items():
                    sim = float(np.mean(v)) if stat == "mean" else float(np.percentile(v, float(stat[1:])))
                    r = math.log(max(sim, 1e-9) / real[key][stat]) / HUBER
                    total += weight * HUBER**2 * (math.sqrt(1.0 + r * r) - 1.0)
        return total


def record(experiment: Experiment, profile: RooflineProfile, seed: int = 0, scale: float = 1.0) -> Tape:
    """Simulate ``experiment`` (its stages cut to ``scale`` of their length) and keep its tape."""
    tap, steps = _Tap(profile), []
    result = validate(
        experiment,
        None,
        seed=seed,
        profile=tap,
        scale=scale,
        on_step=lambda r: steps.append((r.started if r.started is not None else r.now - r.duration, r.now)),
    )
    started, ends = np.array([s for s, _ in steps]), np.array([e for _, e in steps])
    ok = [
        r
        for r in result.records
        if r.first_token_time is not None
        and r.finish_time is not None
        and r.status in ("FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED")
    ]
    tape = Tape(
        experiment,
        dict(profile.sizes),
        np.array([s or (0,) * 8 for s in tap.shapes], dtype=float),
        (ends - started) - np.array(tap.times),
        np.array([int(r.request_id[1:].split("-")[0]) for r in ok]),
        np.array([r.first_scheduled_time - r.arrival_time for r in ok]),
        np.searchsorted(started, [r.first_scheduled_time for r in ok], side="left"),
        np.searchsorted(ends, [r.first_token_time for r in ok], side="left"),
        np.searchsorted(ends, [r.finish_time for r in ok], side="left"),
        {int(n.split("_")[1]): experiment.recorded[n]["successes"] for n in experiment.stages},
    )
    tape.base = tape.durations(profile.hardware.efficiency)
    # A stage the simulation queued (its mean TTFT ten times the real one's and over a second) while the real run
    # did not: re-timing keeps its queue (each request still starts in the step it started in), so it would only
    # pull the fit; left out of this round's loss, it is back in the next round's once the fit has freed it.
    real = {st: r["latency"]["time_to_first_token"]["mean"] for st, r in tape.recorded.items()}
    tape.queued = frozenset(
        st
        for st, v in tape.retime(profile.hardware.efficiency).items()
        if float(np.mean(v["ttft"])) > max(1.0, 10 * real[st])
    )
    return tape


def fit(tapes: Sequence[Tape], start: Efficiency, iterations: int = 1500) -> Efficiency:
    """The efficiencies minimising the tapes' summed loss, from ``start`` (Nelder-Mead, in log/logit space)."""
    x0 = np.array([_to(f, getattr(start, f)) for f in FIELDS])

    prior = np.array([_to(f, getattr(PRIORS, f)) for f in FIELDS])

    def loss(x: np.ndarray) -> float:
        return sum(t.loss(_efficiency(x, start)) for t in tapes) + PRIOR_WEIGHT * float(np.sum((x - prior) ** 2))

    return _efficiency(nelder_mead(loss, x0, iterations), start)


def calibrate(
    experiments: Sequence[Experiment],
    profiles: Callable[[Experiment, Efficiency], RooflineProfile],
    start: Efficiency,
    rounds: int = 2,
    scale: float = 0.25,
    seed: int = 0,
    log=print,
) -> Efficiency:
    """Fit ``Efficiency`` to ``experiments`` in ``rounds`` (``profiles``: an experiment's profile with efficiencies)."""
    e = start
    for n in range(rounds):
        tapes = [record(x, profiles(x, e), seed, scale) for x in experiments]
        for t in tapes:
            if t.queued:
                stages = ", ".join(map(str, sorted(t.queued)))
                log(f"  {t.experiment.name}: stage {stages} queued in simulation only: not fitted this round")
        before = sum(t.loss(e) for t in tapes)
        e = fit(tapes, e)
        log(
            f"round {n + 1}: loss {before:.4f} -> {sum(t.loss(e) for t in tapes):.4f}: "
            + ", ".join(f"{f} {getattr(e, f):.4g}" for f in FIELDS)
        )
    return e


def _to(name: str, value: float) -> float:
    """A parameter in the space the search moves in: logit for a share, log for the rest."""
    if name in SHARES:
        v = min(max(value, 1e-4), 1 - 1e-4)
        return math.log(v / (1 - v))
    return math.log(max(value, 1e-6))


def _efficiency(x: np.ndarray, base: Efficiency) -> Efficiency:
    values = {f: (1 / (1 + math.exp(-v)) if f in SHARES else math.exp(v)) for f, v in zip(FIELDS, x)}
    return base.model_copy(update=values)


def nelder_mead(f: Callable[[np.ndarray], float], x0: np.ndarray, iterations: int, step: float = 0.3) -> np.ndarray:
    """Minimise ``f`` from ``x0`` (the standard reflect / expand / contract / shrink simplex)."""
    n = len(x0)
    simplex = [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]
    values = [f(x) for x in simplex]
    for _ in range(iterations):
        order = np.argsort(values)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if values[-1] - values[0] < 1e-10:
            break
        centre = np.mean(simplex[:-1], axis=0)
        worst = simplex[-1]
        reflected = centre + (centre - worst)
        fr = f(reflected)
        if fr < values[0]:
            expanded = centre + 2 * (centre - worst)
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = centre + 0.5 * (worst - centre)
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                simplex = [simplex[0] + 0.5 * (x - simplex[0]) for x in simplex]
                values = [values[0]] + [f(x) for x in simplex[1:]]
    return simplex[int(np.argmin(values))]
