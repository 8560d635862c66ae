"""The decision log: every scheduling decision of a run and its reason, one Parquet row each.

An ``on_step`` observer. The reasons come from the core: each step operation notes why it turned
a group away, with the numbers its check compared (``SchedulerOutput.decisions``, see
``core/decisions.py``), so every policy gets them without writing a line. This observer adds
what only the whole step shows (which requests finished, which running requests the step left
out) and writes the rows to Parquet in row groups as the run goes, so a long run's log never sits
in memory; the file appears under its name only once the run has ended (``close``).

A lane step (plain decodes advanced together) adds no row per member: its decodes are the
``decode_seqs`` of the time series. A waiting request the policy never offered gets no row
either; ``kvsched.metrics.wait_reasons`` derives its reason from the step's other rows (the policy's
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

COLUMNS = (
    "step",
    "time_s",
    "event",
    "request_id",
    "reason",
    "queue",
    "tokens",
    "cached_tokens",
    "tokens_left",
    "needed",
    "available",
    "other_request",
    "detail",
)
ROW_GROUP = 65_536  # rows buffered before they are written

_WAITS = {Decision.NO_BLOCKS: "no_blocks", Decision.TOKEN_BUDGET: "token_budget", Decision.SEQ_BUDGET: "seq_budget"}
_PREFILL, _PREEMPTED, _SWAPPED_IN, _IGNORED_NOTE, _HELD = (
    Decision.PREFILL,
    Decision.PREEMPTED,
    Decision.SWAPPED_IN,
    Decision.IGNORED,
    Decision.HELD,
)
_IGNORED = SequenceStatus.FINISHED_IGNORED


def schema():
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
        self._schema = schema()
        self._writer = pq.ParquetWriter(self._partial, self._schema)
        self._rows: list[tuple] = []  # not written yet
        self.num_rows = 0
        self._running: dict[str, None] = {}  # running at the start of the next step, in the order they joined
        self._prefilling: dict[str, int] = {}  # the running ones with prompt tokens still to compute -> how many
        self._swapped: set[str] = set()

    def __call__(self, r: StepReport) -> None:
        out = r.output
        self._step(r.step, r.now - r.duration, out.decisions, out.lane_decodes, out.scheduled, r.finished)

    def on_steps(self, run) -> None:
        """A steady run (``StepRun``, kvsched.executors.steady_runs), step by step as its reports would say it
        (lane decodes of every running request)."""
        lane, last = run.output.lane_decodes, len(run.duration) - 1
        if (
            not run.output.decisions and not self._prefilling
        ):  # no step has notes, nobody left out: only the last step's finishes
            self._step(run.first + last, run.now[last] - run.duration[last], [], lane, (), run.finished)
            return
        for i, (now, duration) in enumerate(zip(run.now, run.duration)):
            self._step(run.first + i, now - duration, run.decisions(i), lane, (), run.finished if i == last else ())

    def _step(self, step: int, start: float, notes, lane: int, scheduled, finished) -> None:
        prefilling = self._prefilling
        if lane and not prefilling and len(notes) == 1 and notes[0].kind in _WAITS:
            # the commonest step under load: the decode lane, and admission stopped at the head of the queue
            code, rid, needed, available = notes[0]
            queue = "running" if rid in self._running else "swapped" if rid in self._swapped else "waiting"
            self._rows.append(
                (step, start, "wait", rid, _WAITS[code], queue, None, None, None, needed, available, None, None)
            )
        elif notes or prefilling or not lane:  # else a lane step that decided nothing: nobody left out
            prefilling_before, had_running = tuple(prefilling.items()) if prefilling else (), bool(self._running)
            touched, joined = self._notes(step, start, notes)
            if prefilling_before or not lane:
                self._batch(step, start, lane, scheduled[lane:], prefilling_before, had_running, touched, joined)
        for g in finished:
            rid = g.request_id
            self._running.pop(rid, None)
            prefilling.pop(rid, None)
            n = g.request.sampling.n
            for i in range(n if n > 1 else 0):  # children vLLM V1's mechanics fanned it out into (mechanics/fanout.py)
                self._running.pop(f"{i}_{rid}", None)
                prefilling.pop(f"{i}_{rid}", None)
            if g.status is not _IGNORED:
                self._rows.append(
                    (
                        step,
                        start,
                        "finished",
                        rid,
                        g.status.finish_reason,
                        "running",
                        None,
                        None,
                        None,
                        None,
                        None,
                        None,
                        None,
                    )
                )
        if len(self._rows) >= ROW_GROUP:
            self._flush()

    def _notes(self, step: int, start: float, notes: list[tuple]) -> tuple[set[str], list[str]]:
        """A row per note of the core; returns the requests that were running when a note named
        them, and those the step admitted or swapped in."""
        rows, running, prefilling, swapped = self._rows, self._running, self._prefilling, self._swapped
        touched: set[str] = set()
        joined: list[str] = []
        for note in notes:
            code, rid = note.kind, note.request_id
            if rid in running:
                touched.add(rid)
            if code is _PREFILL:
                admitted = rid not in running
                if admitted:
                    running[rid] = None
                    joined.append(rid)
                if note.left:
                    prefilling[rid] = note.left
                else:
                    prefilling.pop(rid, None)
                rows.append(
                    (
                        step,
                        start,
                        "admitted" if admitted else "prefill",
                        rid,
                        None,
                        "waiting" if admitted else "running",
                        note.tokens,
                        note.cached if admitted else None,
                        note.left,
                        None,
                        None,
                        None,
                        None,
                    )
                )
            elif code in _WAITS:
                queue = "running" if rid in running else "swapped" if rid in swapped else "waiting"
                needed, available, why = note.needed, note.available, _WAITS[code]
                rows.append((step, start, "wait", rid, why, queue, None, None, None, needed, available, None, None))
            elif code is _PREEMPTED:
                running.pop(rid, None)
                prefilling.pop(rid, None)
                if note.mode.value == "swap":
                    swapped.add(rid)
                mode, by, why = note.mode.value, note.requester, note.reason
                rows.append((step, start, "preempted", rid, mode, "running", None, None, None, None, None, by, why))
            elif code is _SWAPPED_IN:
                swapped.discard(rid)
                running[rid] = None
                joined.append(rid)
                rows.append(
                    (step, start, "swapped_in", rid, None, "swapped", None, None, None, note.blocks, None, None, None)
                )
            elif code is _IGNORED_NOTE:
                queue = "swapped" if rid in swapped else "waiting"
                swapped.discard(rid)
                rows.append((step, start, "ignored", rid, None, queue, None, None, None, None, None, None, note.reason))
            elif code is _HELD:
                reason, numbers = str(note.reason), format_numbers(note.numbers)
                rows.append((step, start, "held", None, reason, None, None, None, None, None, None, None, numbers))
        return touched, joined

    def _batch(
        self,
        step: int,
        start: float,
        lane: int,
        outside: list,
        prefilling: tuple[tuple[str, int], ...],
        had_running: bool,
        touched: set[str],
        joined: list[str],
    ) -> None:
        """Rows for the requests running at the step's start that it neither ran nor gave a decision.

        A prompt's last token computed alone is scheduled as a one-token decode (it samples the first
        token): it gets its prefill row here. A lane step ran every running request that was
        decoding, and a recomputed prompt down to its last token rides the lane too; so only those
        further from the end of a prefill (``prefilling``: request, tokens left, as the step began)
        can have been left out. Otherwise the batch says who ran (a step without the lane already
        costs one entry per member)."""
        rows = self._rows
        ran = {sg.group.request_id for sg in outside if not sg.is_prefill}
        for rid, tokens_left in prefilling:
            if rid in ran or (lane and tokens_left == 1 and rid not in touched):
                ran.add(rid)
                self._prefilling.pop(rid, None)
                rows.append((step, start, "prefill", rid, None, "running", 1, None, 0, None, None, None, None))
        if not had_running:
            return
        if lane:
            candidates = [rid for rid, _ in prefilling if rid not in ran]
        elif not ran and not touched:
            rows.append(
                (step, start, "left_out", None, "not_offered", "running", None, None, None, None, None, None, None)
            )
            return
        else:
            new = set(joined)  # (the preempted ones were touched)
            candidates = [rid for rid in self._running if rid not in ran and rid not in new]
        for rid in candidates:
            if rid not in touched:
                rows.append(
                    (step, start, "left_out", rid, "not_offered", "running", None, None, None, None, None, None, None)
                )

    def _flush(self) -> None:
        import pyarrow as pa

        if self._rows:  # the tuples become columns in Arrow, a struct array at a time (transposing in Python cost 4x)
            rows = pa.array(self._rows, type=pa.struct(list(self._schema)))
            self._writer.write_table(pa.Table.from_struct_array(rows))
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
