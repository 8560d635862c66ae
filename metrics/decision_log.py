"""The decision log: every scheduling decision of a run and its reason, one Parquet row each.

An ``on_step`` observer. The reasons come from the core: each step operation notes why it turned
a group away, with the numbers its check compared (``SchedulerOutput.decisions``, see
``core/step_notes.py``), so every policy gets them without writing a line. This observer adds
what only the whole step shows (which requests finished, which running requests the step left
out) and writes the rows to Parquet in row groups as the run goes, so a long run's log never sits
in memory; the file appears under its name only once the run has ended (``close``).

A lane step (plain decodes advanced together) adds no row per member: its decodes are the
``decode_seqs`` of the time series. A waiting request the policy never offered gets no row
either; ``kvsched.reporting.runlog`` derives its reason from the step's other rows (the policy's
``held`` reason, where admission stopped, a swapped queue), so a step costs its decisions, not
its queue lengths.

Rows (``COLUMNS``; ``queue`` is where the request was when the decision was taken: waiting,
swapped or running; unused fields are null):

============  ===============================================================================
event         fields
============  ===============================================================================
admitted      tokens computed now, cached_tokens, tokens_left (a chunked prompt's rest)
prefill       a later chunk of a prompt: tokens, tokens_left (the prompt's last token, when
              it is computed alone, runs as a one-token decode: it gets a row too)
swapped_in    needed: blocks moved back to the GPU
preempted     reason: recompute or swap; other_request: the request it made room for
              (null: the policy preempted it)
ignored       detail: why it can never run
finished      reason: stop or length
wait          reason: no_blocks (needed blocks against the free ones, available; the
              watermark must stay free), token_budget or seq_budget (needed against left)
held          the policy's reason for admitting nothing (more); detail: the numbers it compared
left_out      a running request the step did not run although nothing noted why (reason
              not_offered); request_id null: every running request
============  ===============================================================================
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from kvsched.core.decisions import Decision
from kvsched.core.sequence import SequenceStatus

if TYPE_CHECKING:
    from kvsched.core.report import StepReport

COLUMNS = ("step", "time_s", "event", "request_id", "reason", "queue", "tokens", "cached_tokens", "tokens_left",
           "needed", "available", "other_request", "detail")
ROW_GROUP = 65_536  # rows buffered before they are written

_WAITS = {Decision.NO_BLOCKS: "no_blocks", Decision.TOKEN_BUDGET: "token_budget", Decision.SEQ_BUDGET: "seq_budget"}
_IGNORED = SequenceStatus.FINISHED_IGNORED


def _schema():
    import pyarrow as pa

    s, i = pa.string(), pa.int64()
    types = (pa.int64(), pa.float64(), s, s, s, s, i, i, i, i, i, s, s)
    return pa.schema(list(zip(COLUMNS, types)))


def format_numbers(numbers: dict) -> str:
    """``{"waited_s": 0.81, "limit_s": 1.05}`` → ``waited_s=0.81 limit_s=1.05`` (what ``hold_back`` was given)."""
    return " ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in numbers.items())


class DecisionLog:
    """Writes ``path`` (Parquet) from the steps it observes; ``close()`` when the run has ended."""

    def __init__(self, path: Path) -> None:
        import pyarrow.parquet as pq

        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._partial = self.path.with_name(self.path.name + ".partial")
        self._schema = _schema()
        self._writer = pq.ParquetWriter(self._partial, self._schema)
        self._rows: list[tuple] = []
        self.num_rows = 0
        self._running: set[str] = set()  # running at the start of the next step
        self._prefilling: set[str] = set()  # the running ones with prompt tokens still to compute
        self._swapped: set[str] = set()

    def __call__(self, r: StepReport) -> None:
        out = r.output
        step, start = r.step, r.now - r.duration
        rows, running, prefilling, swapped = self._rows, self._running, self._prefilling, self._swapped
        had_running = bool(running)
        prefilling_before = tuple(prefilling) if prefilling else ()
        touched: set[str] = set()  # running when a decision about it was noted
        joined: list[str] = []  # admitted or swapped in by this step
        left: list[str] = []  # preempted by it
        for note in out.decisions:
            code, rid = note[0], note[1]
            if rid in running:
                touched.add(rid)
            if code is Decision.PREFILL:
                admitted = rid not in running
                if admitted:
                    running.add(rid)
                    joined.append(rid)
                (prefilling.add if note[3] else prefilling.discard)(rid)
                rows.append((step, start, "admitted" if admitted else "prefill", rid, None, "waiting" if admitted else "running",
                             note[2], note[4] if admitted else None, note[3], None, None, None, None))
            elif code in _WAITS:
                queue = "running" if rid in running else "swapped" if rid in swapped else "waiting"
                rows.append((step, start, "wait", rid, _WAITS[code], queue, None, None, None, note[2], note[3], None, None))
            elif code is Decision.PREEMPTED:
                running.discard(rid)
                prefilling.discard(rid)
                left.append(rid)
                if note[2].value == "swap":
                    swapped.add(rid)
                rows.append((step, start, "preempted", rid, note[2].value, "running", None, None, None, None, None, note[3], None))
            elif code is Decision.SWAPPED_IN:
                swapped.discard(rid)
                running.add(rid)
                joined.append(rid)
                rows.append((step, start, "swapped_in", rid, None, "swapped", None, None, None, note[2], None, None, None))
            elif code is Decision.IGNORED:
                queue = "swapped" if rid in swapped else "waiting"
                swapped.discard(rid)
                rows.append((step, start, "ignored", rid, None, queue, None, None, None, None, None, None, note[2]))
            elif code is Decision.HELD:
                rows.append((step, start, "held", None, str(note[2]), None, None, None, None, None, None, None, format_numbers(note[3])))
        ran = {sg.group.request_id for sg in out.scheduled[out.lane_decodes:] if not sg.is_prefill}  # outside the lane
        for rid in ran.intersection(prefilling_before) if prefilling_before else ():
            # a prompt's last token computed alone is scheduled as a one-token decode (which samples the first token)
            prefilling.discard(rid)
            rows.append((step, start, "prefill", rid, None, "running", 1, None, 0, None, None, None, None))
        if had_running:
            self._left_out(r, start, prefilling_before, touched, ran, joined, left)
        for g in r.finished:
            rid = g.request_id
            running.discard(rid)
            prefilling.discard(rid)
            if g.status is not _IGNORED:
                rows.append((step, start, "finished", rid, g.status.finish_reason, "running", None, None, None, None, None, None, None))
        if len(rows) >= ROW_GROUP:
            self._flush()

    def _left_out(self, r: StepReport, start: float, prefilling: tuple[str, ...], touched: set[str], ran: set[str],
                  joined: list[str], left: list[str]) -> None:
        """Rows for the requests running at the step's start that it neither ran (``ran``: decodes
        outside the lane) nor gave a decision.

        A lane step ran every running request that was decoding, so only those in the middle of a
        prefill (``prefilling``, as the step began) can have been left out; otherwise the batch
        says who ran (a step without the lane already costs one entry per member)."""
        out = r.output
        if out.lane_decodes:
            candidates = [rid for rid in prefilling if rid not in ran]
        else:
            if not ran and not touched:
                self._rows.append((r.step, start, "left_out", None, "not_offered", "running", None, None, None, None, None, None, None))
                return
            candidates = self._running.difference(joined).union(left) - ran if joined or left else self._running - ran
        for rid in candidates:
            if rid not in touched:
                self._rows.append((r.step, start, "left_out", rid, "not_offered", "running", None, None, None, None, None, None, None))

    def _flush(self) -> None:
        import pyarrow as pa

        if self._rows:
            columns = list(zip(*self._rows))
            self._writer.write_table(pa.table([pa.array(c, f.type) for c, f in zip(columns, self._schema)], schema=self._schema))
            self.num_rows += len(self._rows)
            self._rows = []

    def close(self) -> Path:
        """Write what is left and give the file its name (an interrupted run leaves no log)."""
        self._flush()
        self._writer.close()
        self._partial.replace(self.path)
        return self.path

    def discard(self) -> None:
        """The run failed: drop the partial log."""
        self._writer.close()
        self._partial.unlink(missing_ok=True)
