"""Policy comparison: the same workloads under several policies, side by side (``engine compare``).

Each contender (a policy, or a policy under its own options: ``lcf:victim=mcf``) runs every seed's
workload; the table gives each metric's mean over the seeds with its interval and each contender's
paired change against the baseline (``experiments/evidence.py``), so a difference the seeds do not
support is not read as a win, and one they do is not missed. A workload that does not depend on its
seed (a trace replay at its own times) runs once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvsched.core.config import EngineConfig
from kvsched.experiments.evidence import METRICS, Contest, cell_text, change_text, class_metric, rank_cell, unit_row

# The rows of the comparison table, by experiments.evidence.METRICS key
ROWS = (
    "finished",
    "ignored",
    "aborted",
    "dropped_share",
    "requests_per_s",
    "output_tokens_per_s",
    "ttft_mean_s",
    "ttft_p50_s",
    "ttft_p99_s",
    "tpot_mean_s",
    "tpot_p99_s",
    "e2e_p50_s",
    "e2e_p99_s",
    "preempt_recompute",
    "recompute_tax",
    "prefix_hit_rate",
)
PRIMARY = "ttft_mean_s"  # what the rank row ranks by


@dataclass
class PolicyRun:
    """One contender over every seed: a summary per seed, latencies pooled over the seeds."""

    policy: str
    summaries: list[dict[str, Any]] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class Contender:
    """A policy under its options, as given on the command line (``lcf``, ``lcf:victim=mcf,seed=2``)."""

    text: str
    spec: str
    options: dict[str, str]

    @classmethod
    def parse(cls, text: str) -> Contender:
        """``SPEC`` or ``SPEC:KEY=VALUE,KEY=VALUE`` (a value may hold commas: ``ewsjf:edges=256,1024``); SPEC is
        any policy spec (a name, ``DIST:NAME``, ``file.py:Class``), told from options by the ``=`` after its last
        colon."""
        head, colon, tail = text.rpartition(":")
        if not (colon and head and "=" in tail):
            return cls(text, text, {})
        options: dict[str, str] = {}
        last = None
        for piece in tail.split(","):
            key, eq, value = piece.partition("=")
            if eq and key.strip():
                last = key.strip()
                if last in options:
                    raise ValueError(f"--policy {text!r}: option {last!r} given twice")
                options[last] = value.strip()
            elif last is not None:  # a comma inside a value
                options[last] += "," + piece.strip()
            else:
                raise ValueError(f"--policy {text!r}: after the policy come options KEY=VALUE,KEY=VALUE")
        return cls(text, head, options)

    def label(self, shown_name: str) -> str:
        """How its column is headed: the policy's name, and its options when it has any."""
        return shown_name + (":" + ",".join(f"{k}={v}" for k, v in self.options.items()) if self.options else "")


def distinct_workloads(workloads: list) -> list:
    """``workloads`` (one per seed), or only the first when the seed does not change its requests."""
    if len(workloads) > 1 and workloads[1].requests() == workloads[0].requests():
        return workloads[:1]
    return workloads


MAX_SEEDS = 1_000  # seeds a comparison runs at most: each one a run per policy


def seed_workloads(build: Callable[[int], Any], seed: int, seeds: int) -> list:
    """The workloads of seeds ``seed`` .. ``seed + seeds - 1`` built by ``build(seed)``, or only the
    first when the seed does not change its requests; ``seeds`` is checked before any is built."""
    if not 1 <= seeds <= MAX_SEEDS:
        raise ValueError(f"--seeds must be between 1 and {MAX_SEEDS:,}, got {seeds:,}")
    first = distinct_workloads([build(s) for s in range(seed, seed + min(seeds, 2))])
    return first if len(first) < 2 else first + [build(s) for s in range(seed + 2, seed + seeds)]


def run_policies(
    contenders: list[Contender],
    labels: list[str],
    workloads: list,
    config: EngineConfig,
    profile: str,
    on_done: Callable[[], None] | None = None,
) -> list[PolicyRun]:
    """Simulate each of ``workloads`` (one per seed, the same for every contender) once per contender; ``on_done``
    after each."""
    from kvsched.experiments.simulation import SimJob

    runs = []
    for contender, label in zip(contenders, labels):
        run = PolicyRun(label)
        for workload in workloads:
            outcome = SimJob(
                workload, contender.spec, config, profile, contender.options or None, record_timeseries=False
            ).run()
            run.summaries.append(outcome.summary)
            done = [r for r in outcome.result.requests if r.ttft is not None]
            run.ttft += [r.ttft for r in done]
            run.tpot += [r.tpot for r in done if r.tpot is not None]
            if on_done is not None:
                on_done()
        runs.append(run)
    return runs


def contest(runs: list[PolicyRun], baseline: str) -> Contest:
    """The runs as a ``Contest``: one unit per seed."""
    return Contest({run.policy: [unit_row(s) for s in run.summaries] for run in runs}, baseline)


def table(runs: list[PolicyRun], baseline: str) -> tuple[list[str], list[list[str]]]:
    """The comparison table: a heading, then a rank row and one row per metric; a column per contender
    (mean and interval over the seeds) and, after each but the baseline, its paired change against it."""
    game = contest(runs, baseline)
    head = ["metric"]
    for c in game.contenders:
        head += [c] if c == baseline else [c, f"{c} vs {baseline}"]
    primary = METRICS[PRIMARY]
    ranks = game.ranks(primary)
    rows = [_row(game, f"rank by {primary.heading}", lambda c: rank_cell(ranks, c), lambda c: "")]
    for key in ROWS:
        m = METRICS[key]
        if key == "prefix_hit_rate" and all(game.values(c, m) is None for c in game.contenders):
            continue  # a single engine reports no prefix hits: a fleet does
        rows.append(
            _row(
                game,
                m.heading,
                lambda c, m=m: cell_text(game.cell(c, m), m),
                lambda c, m=m: change_text(game.change(c, m), m),
            )
        )
    classes = dict.fromkeys(k for unit in game.rows[baseline] for k in unit if "|" in k)  # per class, in the order met
    for key in classes:
        m = class_metric(key)
        rows.append(
            _row(
                game,
                m.heading,
                lambda c, m=m: cell_text(game.cell(c, m), m),
                lambda c, m=m: change_text(game.change(c, m), m),
            )
        )
    rows.append(_row(game, "warnings", lambda c: str(len(warnings_of(runs, c))), lambda c: ""))
    predictors = {run.policy: sorted({s.get("length_predictor") or "–" for s in run.summaries}) for run in runs}
    if any(
        p != ["–"] for p in predictors.values()
    ):  # what a policy knew of output lengths (policies/length_predictors.py)
        rows.append(_row(game, "length predictor", lambda c: ", ".join(predictors[c]), lambda c: ""))
    return head, rows


def _row(game: Contest, label: str, cell: Callable[[str], str], change: Callable[[str], str]) -> list[str]:
    row = [label]
    for c in game.contenders:
        row += [cell(c)] if c == game.baseline else [cell(c), change(c)]
    return row


def warnings_of(runs: list[PolicyRun], contender: str) -> list[str]:
    """The distinct warnings of a contender's runs (``metrics/warnings.py``), each once."""
    from kvsched.metrics.warnings import warning_text

    run = next(r for r in runs if r.policy == contender)
    return sorted({warning_text(w, s.get("num_requests")) for s in run.summaries for w in s.get("warnings") or ()})


def split_options(pairs: dict[str, str], policies: list[str]) -> dict[str, dict[str, str]]:
    """``POLICY.KEY=VALUE`` options to ``{policy: {key: value}}``: POLICY is the longest of ``policies`` the
    dotted name starts with (a file policy's path holds dots of its own)."""
    out: dict[str, dict[str, str]] = {}
    for dotted, value in pairs.items():
        name = max(
            (p for p in policies if dotted.startswith(p + ".") and len(dotted) > len(p) + 1), key=len, default=None
        )
        if name is None:
            raise ValueError(f"--policy-opt is POLICY.KEY=VALUE with POLICY one of {policies}, got {dotted!r}")
        out.setdefault(name, {})[dotted[len(name) + 1 :]] = value
    return out
