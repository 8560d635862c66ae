"""``engine explain``: why requests waited, as text, from a results folder's decision log.

Three views: the whole run (where the waiting went, weighted by time), one request (its phases,
each wait with its reasons and step numbers, its preemptions and what it waited behind) and one
step (its batch, and who was left out and why). Plain lines, so that the terminal and the HTML
report show the same thing. A fleet's folder is explained by its router's decisions instead
(``explain_fleet.py``).
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

import numpy as np

from kvsched.metrics.phases import WAITING_PHASES, Phase, all_phases, phases_of, sampled_ids, state_rows
from kvsched.metrics.wait_reasons import ARRIVAL, WaitReasons, label
from kvsched.reporting.files import RunFiles, read_run

SHOWN = 8  # request ids listed before "and N more"
SHORT_LINES = 40  # a request's view without --full: at most about this many lines
PHASE_LINES = 2  # of each phase's lines (its heading and the first below it), without --full
KEPT_PHASES = (8, 4)  # phases kept from the start and from the end, without --full


def _ids(ids: list[str], limit: int = SHOWN) -> str:
    more = f" and {len(ids) - limit:,} more" if len(ids) > limit else ""
    return ", ".join(ids[:limit]) + more


def _count(n: int, thing: str) -> str:
    return f"{n:,} {thing}{'s' * (n != 1)}"


def _steps(first: int, last: int) -> str:
    return f"step {first:,}" if first == last else f"steps {first:,}–{last:,}"


def _span(lo: float, hi: float) -> str:
    return f"{lo:,.0f}" if lo == hi else f"{lo:,.0f}–{hi:,.0f}"


def numbers(key: str, checks: list[tuple[int, int]], watermark: int) -> str:
    """What the failed checks compared: ``needed 34–90 blocks, 2–30 free (20 stay free: the watermark)``."""
    if not checks:
        return ""
    needed, available = np.array(checks).T
    key = key.removeprefix("behind:")
    what = {
        "no_blocks": f"blocks, {{}} free ({watermark:,} stay free: the watermark)",
        "token_budget": "tokens, {} left in the step",
        "seq_budget": "sequences, {} seats left",
    }.get(key, "needed, {} available")
    return f"needed {_span(needed.min(), needed.max())} " + what.format(_span(available.min(), available.max()))


def _shortened(blocks: list[list[str]], rid: str) -> list[str]:
    """Each phase's first ``PHASE_LINES`` lines, and of many phases the first and last ``KEPT_PHASES``."""
    head, tail = KEPT_PHASES
    kept = blocks if len(blocks) <= head + tail else [*blocks[:head], None, *blocks[-tail:]]
    lines = []
    for block in kept:
        if block is None:
            lines.append(f"{'':16}… {_count(len(blocks) - head - tail, 'phase')} more (--full shows them)")
            continue
        lines += block[:PHASE_LINES] + (
            [f"{'':40}… {_count(len(block) - PHASE_LINES, 'line')} more"] if len(block) > PHASE_LINES else []
        )
    return lines


class Explainer:
    """One results folder, ready to explain."""

    def __init__(self, run: RunFiles) -> None:
        self.run = run
        self.why = WaitReasons(run.events, run.steps, run.requests)
        self.requests = run.requests.set_index("request_id", drop=False)
        config = run.summary["config"]
        self.watermark = int(config["watermark"] * config["num_gpu_blocks"])  # EngineConfig.watermark_blocks

    @classmethod
    def load(cls, directory: Path) -> Explainer:
        return cls(read_run(directory))

    @cached_property
    def phases(self) -> dict[str, list[Phase]]:
        return all_phases(self.run.events, self.run.requests, self.why.start, self.why.end)

    @cached_property
    def samples(self) -> dict[str, list[str]]:
        """Each request's ids in the log (a request fanned out under V1: its children's, ``metrics.phases``)."""
        return sampled_ids(self.run.events, self.run.requests)

    def request_of(self, sid: str) -> str:
        """The request an id of the log belongs to: itself, or the parent of a fanned-out child."""
        if sid in self.requests.index:
            return sid
        parent = sid.partition("_")[2]
        if parent in self.samples and sid in self.samples[parent]:
            return parent
        raise KeyError(f"no request {sid!r} in {self.run.directory}")

    def phases_of(self, sid: str) -> list[Phase]:
        rows = state_rows(self.why.rows_of(sid))
        r = self.requests.loc[self.request_of(sid)]
        return phases_of(
            list(zip(*(rows[c] for c in rows.columns[1:]))), r.arrival_time, r.finish_time, self.why.start, self.why.end
        )

    # ------------------------------------------------------------------------- the run
    def overview(self, top: int = 10) -> list[str]:
        s, ev = self.run.summary, self.run.events
        w = s.get("workload", {})
        lines = [
            f"{s['policy']} · {w.get('name') or w.get('kind', 'workload')} · {s['num_requests']:,} requests · "
            f"{s['duration_s']:,.0f} s simulated · {s['steps']:,} steps"
        ]
        table = self.why.time_by_reason()
        for queue, title in (
            ("waiting", "waiting for admission"),
            ("swapped", "swapped out, waiting to come back"),
            ("running", "running, but not run in a step (or preempted)"),
        ):
            part = table[table.queue == queue]
            if part.empty:
                continue
            total = part.request_s.sum()
            lines += ["", f"{title}: {total:,.1f} request·s"]
            for r in part.head(top).itertuples():
                lines.append(f"  {100 * r.request_s / total:5.1f}%  {r.request_s:14,.1f} request·s  {r.reason}")
        pre = ev[ev.event == "preempted"]
        if len(pre):
            modes = pre.reason.value_counts()
            lines += ["", f"preemptions: {len(pre):,} (" + ", ".join(f"{m} {n:,}" for m, n in modes.items()) + ")"]
        ign = ev[ev.event == "ignored"]
        if len(ign):
            lines += ["", f"ignored: {len(ign):,}"]
            for rule, n in ign.detail.str.replace(r"\d+", "N", regex=True).value_counts().items():
                lines.append(f"  {n:,}  {rule}")
        longest = self.run.requests[self.run.requests.queueing_time > 0].nlargest(5, "queueing_time")
        if len(longest):
            lines += ["", "longest waits before the first step (engine explain DIR --request ID):"]
            for r in longest.itertuples():
                lines.append(f"  {r.request_id}: {r.queueing_time:,.1f} s")
        return lines

    # ---------------------------------------------------------------------- a request
    def request(self, rid: str, full: bool = False) -> list[str]:
        """One request's timeline: a header, its phases (each wait with its reasons, each preemption with the
        policy's reason), what it waited for in all; past ``SHORT_LINES`` lines, shortened unless ``full``."""
        parent = self.request_of(rid)
        r = self.requests.loc[parent]
        samples = self.samples[parent] if rid == parent else [rid]
        lines = [
            f"{rid}{'' if rid == parent else f' (one of the {r.n} requests {parent} fanned out into)'} · prompt "
            f"{r.prompt_tokens:,} tokens · {r.output_tokens:,} output tokens · {r.status}"
            + (f" ({r.detail})" if isinstance(r.detail, str) else ""),
            "  ".join(
                f"{name} {value:,.3f} s"
                for name, value in (
                    ("arrived", r.arrival_time),
                    ("queueing", r.queueing_time),
                    ("TTFT", r.ttft),
                    ("e2e", r.e2e),
                )
                if value == value and value is not None
            )
            + (f"  TPOT {1000 * r.tpot:,.1f} ms" if r.tpot == r.tpot and r.tpot is not None else "")
            + f"  preemptions: {r.preemptions_recompute} recompute, {r.preemptions_swap} swap",
            "",
        ]
        waited: dict[str, float] = {}
        blocks = []
        for sid in samples:  # a request fanned out under V1 (n > 1): each child request, one after the other
            for p in self.phases_of(sid):
                block = [
                    f"{p.start_s:12,.3f} – {p.end_s:12,.3f} s  {_steps(p.first_step, p.last_step):>22}  "
                    f"{p.kind}" + (f" ({p.detail})" if p.detail else "") + (f"  [{sid}]" if sid != rid else "")
                ]
                if p.kind in WAITING_PHASES:
                    block += self._wait_lines(sid, p, waited)
                elif p.kind == "decode":
                    block += self._decode_lines(sid, p)
                else:
                    block += self._prefill_lines(sid, p)
                blocks.append(block)
        total = sum(waited.values())
        tail = []
        if total > 0:
            shares = sorted(waited.items(), key=lambda kv: -kv[1])
            tail = [
                "",
                f"waited {total:,.3f} s in all: "
                + "; ".join(f"{100 * v / total:.1f}% {label(k)}" for k, v in shares[:4]),
            ]
        every = sum(map(len, blocks))
        if full or len(lines) + every + len(tail) <= SHORT_LINES:
            return lines + [line for block in blocks for line in block] + tail
        return (
            lines
            + _shortened(blocks, rid)
            + tail
            + [
                "",
                f"(shortened from {len(lines) + every + len(tail):,} lines: "
                f"engine explain DIR --request {rid} --full shows every one)",
            ]
        )

    def _wait_lines(self, rid: str, p: Phase, waited: dict[str, float]) -> list[str]:
        pad, why = " " * 40, self.why
        lines, first = [], p.first_step
        if p.kind == "queued":  # from its arrival to the start of the first step that saw it
            begin = why.start[first] if first < len(why.start) else p.end_s
            key, where = ARRIVAL, ""
        else:  # the step that preempted it
            begin, first = why.start[first] + why.interval[first], first + 1
            key, where = f"preempted_{'swap' if p.kind == 'swapped' else 'recompute'}", _steps(first - 1, first - 1)
        if begin > p.start_s:
            waited[key] = waited.get(key, 0.0) + begin - p.start_s
            lines.append(f"{'':16}{where:>22}  {begin - p.start_s:10,.3f} s  {label(key)}")
        if p.kind != "queued":  # the policy's own word on why it chose this request as its victim, if it gave one
            why_me = self.why.rows_of(rid)
            said = why_me.detail[(why_me.event == "preempted") & (why_me.step == first - 1)].dropna()
            if len(said):
                lines.append(f"{pad}  the policy's reason: {said.iloc[-1]}")
        for run in why.reason_runs(rid, WAITING_PHASES[p.kind], first, p.last_step, begin):
            for key, seconds in run.seconds.items():
                waited[key] = waited.get(key, 0.0) + seconds
            only = (
                next(iter(run.seconds)) if len(run.seconds) == 1 else run.key
            )  # say what stopped it when one thing did
            lines.append(
                f"{'':16}{_steps(run.first_step, run.last_step):>22}  {run.end_s - run.start_s:10,.3f} s  {label(only)}"
            )
            total = max(run.end_s - run.start_s, 1e-12)
            for key, seconds in sorted(run.seconds.items(), key=lambda kv: -kv[1]):
                checks = numbers(key, run.numbers.get(key, []), self.watermark)
                if len(run.seconds) > 1:  # a head-of-line stretch stopped by several kinds of check
                    lines.append(
                        f"{pad}  {100 * seconds / total:5.1f}% {label(key)}" + (f" ({checks})" if checks else "")
                    )
                elif checks:
                    lines.append(f"{pad}  {checks}")
            if run.blockers:
                lines.append(f"{pad}  stopped at {_count(len(run.blockers), 'request')}: {_ids(run.blockers)}")
            if run.details:  # the numbers the policy compared, as it began and as it ended
                lines.append(f"{pad}  {run.details[0]}" + (f" … {run.details[-1]}" if len(run.details) > 1 else ""))
        ev = self.why.in_steps(p.first_step, p.last_step)
        ahead = ev[(ev.event == "admitted") & (ev.request_id != rid)]
        if len(ahead):
            lines.append(
                f"{pad}meanwhile {_count(len(ahead), 'admission')} went ahead of it: {_ids(list(ahead.request_id))}"
            )
        return lines

    def _decode_lines(self, rid: str, p: Phase) -> list[str]:
        in_phase = self.why.in_steps(p.first_step, p.last_step)
        out = in_phase[(in_phase.event == "left_out") & (in_phase.request_id.isna() | (in_phase.request_id == rid))]
        budget = in_phase[(in_phase.event == "wait") & (in_phase.request_id == rid)]
        steps = p.last_step - p.first_step + 1
        lines = [f"{'':40}ran in {steps - len(out) - len(budget):,} of {steps:,} steps"]
        at = out.step.to_numpy()
        for key in dict.fromkeys(self.why.running_key[at]):
            mine = at[self.why.running_key[at] == key]
            lines.append(
                f"{'':40}not run in {_count(len(mine), 'step')} ({self.why.interval[mine].sum():,.3f} s): "
                f"{label(key)}, first at step {int(mine[0]):,}"
            )
        for reason, rows in budget.groupby("reason"):
            lines.append(f"{'':40}not run in {_count(len(rows), 'step')}: {label(reason)}")
        return lines

    def _prefill_lines(self, rid: str, p: Phase) -> list[str]:
        rows = self.why.rows_of(rid)
        rows = rows[rows.event.isin(("admitted", "prefill")) & rows.step.between(p.first_step, p.last_step)]
        return [
            f"{'':40}{row.event} at step {row.step:,}: {int(row.tokens):,} tokens"
            + (
                f" ({int(row.cached_tokens):,} cached)"
                if row.cached_tokens == row.cached_tokens and row.cached_tokens
                else ""
            )
            + (f", {int(row.tokens_left):,} left for later chunks" if row.tokens_left else "")
            for row in rows.itertuples()
        ]

    # -------------------------------------------------------------------------- a step
    def step(self, n: int) -> list[str]:
        steps, why = self.run.steps, self.why
        if not 0 <= n < len(steps):
            raise ValueError(f"step {n} is not in this run (steps 0–{len(steps) - 1:,})")
        st = steps.iloc[n]
        ev = why.in_steps(n, n)
        at = {q: int(why.at_start[q][n]) for q in ("waiting", "running", "swapped")}
        lines = [
            f"step {n:,} · {why.start[n]:,.3f} → {why.end[n]:,.3f} s ({1000 * st.duration_s:,.1f} ms) · policy "
            f"{self.run.summary['policy']}",
            f"as it began: {at['waiting']:,} waiting · {at['running']:,} running · {at['swapped']:,} swapped · after "
            f"it: {int(st.gpu_blocks_used):,} of {self.run.summary['config']['num_gpu_blocks']:,} GPU KV blocks used",
            f"batch: {int(st.prefill_groups):,} prefills ({int(st.prefill_tokens):,} tokens), {int(st.decode_seqs):,} "
            "decodes",
        ]
        for row in ev[ev.event.isin(("admitted", "prefill", "swapped_in"))].itertuples():
            what = (
                f"{int(row.tokens):,} tokens"
                if row.event != "swapped_in"
                else f"{int(row.needed):,} blocks back from the CPU"
            )
            lines.append(f"  {row.event:<10} {row.request_id}  {what}")
        decoding = [
            rid
            for rid, ps in self.phases.items()
            if any(p.kind == "decode" and p.first_step <= n <= p.last_step for p in ps)
        ]
        skipped = set(ev.request_id[ev.event.isin(("left_out", "wait", "preempted"))].dropna())
        everyone_out = (ev.event == "left_out").to_numpy() & ev.request_id.isna().to_numpy()
        ran = [] if everyone_out.any() else [rid for rid in decoding if rid not in skipped]
        if ran:
            lines.append(f"  decoded    {_ids(ran)}")
        lines.append("left out:")
        for row in ev[ev.event == "wait"].itertuples():
            checks = numbers(row.reason, [(int(row.needed), int(row.available))], self.watermark)
            lines.append(f"  {row.request_id} ({row.queue}): {label(row.reason)}: {checks}")
        for row in ev[ev.event == "held"].itertuples():
            lines.append(f"  the policy held admission back: {row.reason} ({row.detail})")
        for queue in ("waiting", "swapped"):
            rest = int(why.not_offered(queue)[n])
            if rest:
                key, blocker, _detail = why.step_reason(queue, n)
                lines.append(
                    f"  {queue}: {rest:,} more not offered: {label(key)}"
                    + (f" (stopped at {blocker})" if blocker else "")
                )
        for row in ev[ev.event == "left_out"].itertuples():
            who = row.request_id if isinstance(row.request_id, str) else f"all {at['running']:,} running requests"
            lines.append(f"  {who} not run: {label(why.running_key[n])}")
        for row in ev[ev.event == "preempted"].itertuples():
            whom = f"to make room for {row.other_request}" if isinstance(row.other_request, str) else "by the policy"
            lines.append(
                f"preempted  {row.request_id} ({row.reason}) {whom}"
                + (f": {row.detail}" if isinstance(row.detail, str) else "")
            )
        for row in ev[ev.event == "ignored"].itertuples():
            lines.append(f"ignored    {row.request_id}: {row.detail}")
        done = ev[ev.event == "finished"]
        if len(done):
            lines.append(f"finished   {_ids(list(done.request_id))}")
        return lines
