"""Per-request records on disk: streamed to Parquet as requests finish, read back a column at a time.

``Recorder`` keeps records in the order the requests arrived (one that finishes early waits for
those that arrived before it, so the file reads as the in-memory records do), in memory or in a
Parquet file, ``row_group_size`` rows a row group; a fleet's records (``cluster/records.py``) are
kept by one. ``RequestLog`` makes a single run's records from the groups handed over as they end (a single run is
a fleet of one, whose loop hands them over as a fleet's does): each a ``RequestMetrics`` row, streamed through a
``Recorder`` as the run goes. The file appears under its name only when ``close()`` completes it. ``RequestTable``
reads it back: its rows as ``RequestMetrics``, or single columns, which is all the run summary needs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from kvsched.metrics.parquet_rows import ParquetRows, arrow_table
from kvsched.metrics.requests import FIELDS, RequestMetrics, request_row

if TYPE_CHECKING:
    import pandas as pd

    from kvsched.core.engine import Engine
    from kvsched.core.sequence import SequenceGroup

_TYPES = {
    "priority": pa.int64(),
    "n": pa.int64(),
    "prompt_tokens": pa.int64(),
    "output_tokens": pa.int64(),
    "preemptions_recompute": pa.int64(),
    "preemptions_swap": pa.int64(),
    "recomputed_tokens": pa.int64(),
    "discarded_tokens": pa.int64(),
    "computed_tokens": pa.int64(),
    "request_id": pa.string(),
    "status": pa.string(),
    "finish_reason": pa.string(),
    "detail": pa.string(),
    "tenant": pa.string(),
    "slo_class": pa.string(),
    "session_id": pa.string(),
}
SCHEMA = pa.schema([(name, _TYPES.get(name, pa.float64())) for name in FIELDS])  # the rest are times (s): float64


_LABELS = ("status", "finish_reason", "detail", "tenant", "slo_class")  # few distinct values
row_of = attrgetter(*FIELDS)  # a record's fields as a tuple, in column order


def records_table(records: list[RequestMetrics]) -> pa.Table:
    """The records as an Arrow table with the file's schema (what the summary reads in-memory runs from)."""
    return arrow_table([row_of(r) for r in records], SCHEMA)


class Recorder:
    """The records of finished requests, kept in the order the requests arrived whatever order they finish in (one
    that finishes early waits for those that arrived before it): in memory (``rows``), or streamed to a Parquet file
    at ``path``, ``row_group_size`` rows a row group. A single run's records (``RequestLog``) and a fleet's
    (``cluster/records.py``: a run's columns, then the fleet's own) are both kept by one."""

    def __init__(self, schema: pa.Schema = SCHEMA, path: Path | None = None, row_group_size: int = 65_536) -> None:
        self.schema = schema
        self.rows: list[tuple] = []  # in memory: the records kept so far
        self.file = None if path is None else ParquetRows(path, schema, row_group_size)
        self._keep = self.rows.append if self.file is None else self.file.append
        self._waiting: dict[int, tuple] = {}  # finished before a request that arrived earlier: place -> row
        self._next = 0  # the place of the next record to keep

    def add(self, place: int, row: tuple) -> None:
        """The record of the request that arrived ``place``-th (0, 1, ...); a place recorded before is refused."""
        waiting = self._waiting
        if place < self._next or place in waiting:
            raise ValueError(f"request {row[0]!r} is recorded twice")
        waiting[place] = row
        keep = self._keep
        while self._next in waiting:
            keep(waiting.pop(self._next))
            self._next += 1

    def finish(self) -> None:
        """Keep what is left: records waiting for an earlier one never recorded, in order."""
        for place in sorted(self._waiting):
            self._keep(self._waiting.pop(place))

    def close(self) -> RequestTable | pa.Table:
        """``finish``, then the records: as a ``RequestTable`` on the completed file, or in memory as a table."""
        self.finish()
        return arrow_table(self.rows, self.schema) if self.file is None else RequestTable(self.file.close())

    def abandon(self) -> None:
        if self.file is not None:
            self.file.abandon()


class RequestLog:
    """A single run's records, made from its finished groups as they are handed over (``done``): by the loop of a
    single engine's run (``cluster/fleet_of_one.py``), as a fleet's loop hands its records theirs
    (``cluster/records.py``), or by an observer taking them from an engine that a workload drives (``taker``). Kept by
    a ``Recorder`` in the order the requests were added (a group's ``index``): in memory, or streamed to ``path`` as
    they end (memory bounded by the requests in flight)."""

    def __init__(self, path: Path | None = None, row_group_size: int = 65_536) -> None:
        self.recorder = Recorder(SCHEMA, path, row_group_size)
        self.file = self.recorder.file

    def done(self, group: SequenceGroup, replica: object = None) -> None:
        """``group`` ended (on the lone ``replica``, as a fleet's loop says it): its record."""
        self.recorder.add(group.index, request_row(group))

    def taker(self, engine: Engine) -> Callable[..., None]:
        """An ``on_step`` observer (of steady runs too) that records the groups ``engine`` ended since its last call."""
        take, done = engine.take_finished, self.done

        def take_finished(report: object = None) -> None:
            for group in take():
                done(group)

        take_finished.on_steps = take_finished
        return take_finished

    def close(self) -> list[RequestMetrics] | RequestTable:
        """The run is over: every record, in memory, or as a ``RequestTable`` on the completed file."""
        if self.file is not None:
            return self.recorder.close()
        self.recorder.finish()
        return [RequestMetrics(*row) for row in self.recorder.rows]

    def abandon(self) -> None:
        self.recorder.abandon()


class RequestTable:
    """A run's records in a Parquet file: ``len``, iteration as ``RequestMetrics``, or one column at a time."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._file = pq.ParquetFile(self.path)

    @property
    def num_rows(self) -> int:
        return self._file.metadata.num_rows

    def __len__(self) -> int:
        return self.num_rows

    def __iter__(self) -> Iterator[RequestMetrics]:
        for batch in self._file.iter_batches():
            for row in batch.to_pylist():
                yield RequestMetrics(**row)

    def rows(self) -> Iterator[tuple]:
        """Every record's fields as a tuple in ``FIELDS`` order, a row group's columns at a time (what a CSV writes)."""
        return batch_rows(self._file.iter_batches(columns=list(FIELDS)))

    def column(self, name: str) -> pa.ChunkedArray:
        """One column; a label column (status, tenant, ...) dictionary-encoded, so ten million rows stay small."""
        labels = [name] if name in _LABELS else None
        return pq.ParquetFile(self.path, read_dictionary=labels).read(columns=[name]).column(0)

    def frame(self) -> pd.DataFrame:
        return self._file.read().to_pandas()


def batch_rows(batches: Iterable[pa.RecordBatch]) -> Iterator[tuple]:
    """Each row of ``batches`` as a tuple of Python values, a batch's columns at a time."""
    for batch in batches:
        yield from zip(*[column.to_pylist() for column in batch.columns])


def record_rows(records: list[RequestMetrics] | RequestTable | pa.Table) -> tuple[tuple[str, ...], Iterator[tuple]]:
    """The records' column names and their rows as tuples, kept in memory, read from their file, or a table's: a run's
    records have the columns ``FIELDS``; a fleet's table (``cluster/records.py``) has those first, then its own."""
    if isinstance(records, pa.Table):
        if tuple(records.column_names[: len(FIELDS)]) != FIELDS:
            raise ValueError(f"a table of records starts with the columns {FIELDS}, not {records.column_names}")
        return tuple(records.column_names), batch_rows(records.to_batches())
    return FIELDS, records.rows() if isinstance(records, RequestTable) else map(row_of, records)
