"""Why requests waited: the decision log read back per step, per request, and weighted by time.

The log (``decision_log.py``) has a row for each decision, not for each waiting request in each
step. A waiting request that was turned away has its own row (no blocks, a spent budget); one the
policy never offered takes the reason of the step it waited through, in this order: the policy
held admission back (its own reason and numbers), admission stopped at another request (that
request's reason: head-of-line), requests were swapped out (swap-first), the step preempted, or,
failing all of these, the policy did not offer it. A swapped request's steps read the same way,
with "the step admitted prompts" in place of swap-first; a running request the step did not run
was left out of a prefill-only step, or not offered. Each step's share of a wait runs from its
start to the next step's start, so the shares of a request add up to its time in the queue.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kvsched.metrics.timeseries import step_starts

EPS = 1e-9  # a file without start_s: step starts recomputed as end - duration, allow for the rounding
ARRIVAL = "arrival"

# What each reason key means, for people; "held:<reason>" is the policy's own.
LABELS = {
    "no_blocks": "not enough free KV blocks (LATER)",
    "token_budget": "did not fit in the step's token budget (max_num_batched_tokens)",
    "seq_budget": "did not fit in the sequence budget (max_num_seqs)",
    "behind": "head-of-line: admission stopped at another request",
    "behind:no_blocks": "head-of-line: behind a request that lacked free KV blocks",
    "behind:token_budget": "head-of-line: behind a request that did not fit in the token budget",
    "behind:seq_budget": "head-of-line: behind a request that did not fit in the sequence budget",
    "swapped_first": "not offered: requests were swapped out (they go first)",
    "admitting": "not offered: the step admitted prompts",
    "preempting": "not offered: the step preempted",
    "not_offered": "not offered by the policy",
    "prefill_only": "the step ran prefills only",
    ARRIVAL: "arrived while a step ran (waits for the next one)",
    "preempted_recompute": "preempted (recompute): back to the waiting queue",
    "preempted_swap": "preempted (swap): moved to the CPU",
}


def label(key: str) -> str:
    if key.startswith("held:"):
        return f"held back by the policy: {key[5:]}"
    return LABELS.get(key, key)


def coarse(key: str) -> str:
    """``behind:no_blocks`` → ``behind``: one stretch of head-of-line waiting, whatever stopped admission in each
    step."""
    return "behind" if key.startswith("behind:") else key


@dataclass
class Run:
    """A stretch of steps with one (coarse) reason, inside one request's wait."""

    key: str
    first_step: int
    last_step: int
    start_s: float
    end_s: float
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # fine reason -> time
    numbers: dict[str, list[tuple[int, int]]] = field(
        default_factory=lambda: defaultdict(list)
    )  # fine reason -> (needed, available)
    blockers: list[str] = field(default_factory=list)  # the requests admission stopped at, each once, in order
    details: list[str] = field(default_factory=list)  # the numbers a policy gave ``hold_back``, each once, in order


class WaitReasons:
    """The log's events, the time series' steps and the requests of one run, read together."""

    def __init__(self, events: pd.DataFrame, steps: pd.DataFrame, requests: pd.DataFrame) -> None:
        self.events, self.steps, self.requests = events, steps, requests
        self.start = step_starts(steps)
        self.eps = 0.0 if "start_s" in steps else EPS  # the engine's own start: a request arriving then was seen by it
        self.end = steps.time_s.to_numpy()
        self.interval = np.append(self.start[1:], self.end[-1:]) - self.start
        arrivals = np.sort(requests.arrival_time.to_numpy())
        arrived = np.diff(np.concatenate(([0], np.searchsorted(arrivals, self.start + self.eps, side="right"))))
        before = {
            q: np.concatenate(([0], steps[f"num_{q}"].to_numpy()[:-1])) for q in ("waiting", "running", "swapped")
        }
        self.at_start = {**before, "waiting": before["waiting"] + arrived}  # queue lengths as each step began
        self._context = {q: self._step_context(q) for q in ("waiting", "swapped")}
        prefill_only = (steps.decode_seqs.to_numpy() == 0) & (steps.prefill_groups.to_numpy() > 0)
        self.running_key = np.where(
            prefill_only, "prefill_only", "not_offered"
        )  # a running request left out of the step
        self._by_request = events.groupby("request_id", sort=False).indices
        self._event_steps = events.step.to_numpy()  # in step order, as the log was written

    def rows_of(self, rid: str) -> pd.DataFrame:
        """The log's rows about one request, in log order."""
        return self.events.iloc[self._by_request.get(rid, np.array([], dtype=int))]

    def in_steps(self, first_step: int, last_step: int) -> pd.DataFrame:
        """The log's rows of steps ``first_step..last_step``."""
        lo, hi = np.searchsorted(self._event_steps, [first_step, last_step + 1])
        return self.events.iloc[lo:hi]

    # ------------------------------------------------------------------------ per step
    def _step_context(self, queue: str) -> pd.DataFrame:
        """Per step, the reason of a ``queue`` request it did not offer, the request admission
        stopped at with the numbers of that check, and the policy's own numbers."""
        ev, n = self.events, len(self.start)
        key = np.full(n, "not_offered", dtype=object)
        key[np.unique(ev.step[ev.event == "preempted"])] = "preempting"
        if queue == "waiting":
            key[self.at_start["swapped"] > 0] = "swapped_first"
        else:
            key[np.unique(ev.step[ev.event == "admitted"])] = "admitting"
        ctx = pd.DataFrame({"key": key, "blocker": None, "needed": np.nan, "available": np.nan, "detail": None})
        stops = ev[(ev.event == "wait") & (ev.queue == queue)].drop_duplicates("step")
        at = stops.step.to_numpy()
        ctx.loc[at, "key"] = ("behind:" + stops.reason).to_numpy()
        ctx.loc[at, "blocker"] = stops.request_id.to_numpy()
        ctx.loc[at, "needed"] = stops.needed.to_numpy(dtype=float)
        ctx.loc[at, "available"] = stops.available.to_numpy(dtype=float)
        if queue == "waiting":
            held = ev[ev.event == "held"].drop_duplicates("step")
            ctx.loc[held.step.to_numpy(), "key"] = ("held:" + held.reason).to_numpy()
            ctx.loc[held.step.to_numpy(), "detail"] = held.detail.to_numpy()
        return ctx

    def step_reason(self, queue: str, step: int) -> tuple[str, str | None, str | None]:
        """(reason key, the request admission stopped at, the policy's numbers) for a ``queue`` request not offered
        in ``step``."""
        row = self._context[queue].iloc[step]
        return row.key, row.blocker, row.detail

    def not_offered(self, queue: str) -> np.ndarray:
        """Per step, the ``queue`` requests at its start that it neither took nor turned away with a reason."""
        ev = self.events
        decided = ev[(ev.queue == queue) & ev.event.isin(("admitted", "swapped_in", "ignored", "wait"))]
        return np.clip(self.at_start[queue] - np.bincount(decided.step, minlength=len(self.start)), 0, None)

    # --------------------------------------------------------------- weighted by time
    def time_by_reason(self) -> pd.DataFrame:
        """Request-seconds per queue and reason, largest first: waiting and swapped requests, and
        running ones that a step did not run (or preempted)."""
        ev, iv = self.events, self.interval
        parts = []

        def add(queue, keys, seconds):
            parts.append(pd.DataFrame({"queue": queue, "key": keys, "request_s": seconds}))

        for queue in ("waiting", "swapped"):
            own = ev[(ev.event == "wait") & (ev.queue == queue)]
            add(queue, own.reason.to_numpy(), iv[own.step.to_numpy()])
            add(queue, self._context[queue].key.to_numpy(), self.not_offered(queue) * iv)
        arrival = self.requests.arrival_time.to_numpy()
        first = np.searchsorted(self.start + self.eps, arrival, side="left")
        seen = first < len(self.start)
        add("waiting", ARRIVAL, np.clip(self.start[first[seen]] - arrival[seen], 0, None))
        pre = ev[ev.event == "preempted"]
        add("running", ("preempted_" + pre.reason).to_numpy(), iv[pre.step.to_numpy()])
        out = ev[ev.event == "left_out"]
        at = out.step.to_numpy()
        add("running", self.running_key[at], iv[at] * np.where(out.request_id.isna(), self.at_start["running"][at], 1))
        waits = ev[(ev.event == "wait") & (ev.queue == "running")]
        add("running", waits.reason.to_numpy(), iv[waits.step.to_numpy()])
        table = pd.concat(parts, ignore_index=True)
        table = table[table.request_s > 0].groupby(["queue", "key"], as_index=False).request_s.sum()
        table["reason"] = table.key.map(label)
        return table.sort_values("request_s", ascending=False, ignore_index=True)

    # ---------------------------------------------------------------- per request
    def reason_runs(self, rid: str, queue: str, first_step: int, last_step: int, start_s: float) -> list[Run]:
        """One request's wait in ``queue`` over steps ``first_step..last_step`` (from ``start_s``),
        as stretches of steps with the same coarse reason."""
        if last_step < first_step:
            return []
        ctx = self._context[queue].iloc[first_step : last_step + 1]
        keys, blockers, details = ctx.key.to_numpy().copy(), ctx.blocker.to_numpy().copy(), ctx.detail.to_numpy()
        needed, available = ctx.needed.to_numpy().copy(), ctx.available.to_numpy().copy()
        own = self.rows_of(rid)
        own = own[(own.event == "wait") & own.step.between(first_step, last_step)]
        at = own.step.to_numpy() - first_step
        keys[at], blockers[at] = own.reason.to_numpy(), None
        needed[at], available[at] = own.needed.to_numpy(dtype=float), own.available.to_numpy(dtype=float)
        ends = self.start[first_step : last_step + 1] + self.interval[first_step : last_step + 1]
        seconds = np.diff(np.concatenate(([start_s], ends)))
        kinds = np.where(pd.Series(keys).str.startswith("behind:").to_numpy(), "behind", keys)
        bounds = np.concatenate(([0], np.flatnonzero(kinds[1:] != kinds[:-1]) + 1, [len(kinds)]))
        runs = []
        for a, b in zip(bounds[:-1], bounds[1:]):
            run = Run(kinds[a], first_step + a, first_step + b - 1, start_s if a == 0 else ends[a - 1], ends[b - 1])
            for key in dict.fromkeys(keys[a:b]):
                mine = keys[a:b] == key
                run.seconds[key] = float(seconds[a:b][mine].sum())
                checked = mine & ~np.isnan(needed[a:b])
                run.numbers[key] = list(zip(needed[a:b][checked].astype(int), available[a:b][checked].astype(int)))
            run.blockers = list(dict.fromkeys(x for x in blockers[a:b] if x is not None))
            run.details = list(
                dict.fromkeys(x for x, key in zip(details[a:b], keys[a:b]) if x is not None and key == run.key)
            )
            runs.append(run)
        return runs
