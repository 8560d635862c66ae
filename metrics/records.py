"""Per-request records on disk: streamed to Parquet as requests finish, read back a column at a time.

``RequestLog`` is an ``on_step`` observer for an engine that does not retain finished groups: each
finished group becomes a ``RequestMetrics`` row the step it ends, rows leave in the order the
requests were added (one that finishes early waits for those added before it, so the file reads
as the in-memory records do), and every ``row_group_size`` rows become one Parquet row group. The
file appears under its name only when ``close()`` completes it. ``RequestTable`` reads it back:
its rows as ``RequestMetrics``, or single columns, which is all the run summary needs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from kvsched.core.view import group_of
from kvsched.metrics.parquet_rows import ParquetRows, arrow_table
from kvsched.metrics.requests import FIELDS, RequestMetrics

if TYPE_CHECKING:
    import pandas as pd

    from kvsched.core.report import StepReport

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


class RequestLog:
    """Streams the records of finished requests to ``path``; call ``close()`` after the run."""

    def __init__(self, path: Path, row_group_size: int = 65_536) -> None:
        self.file = ParquetRows(path, SCHEMA, row_group_size)
        self._waiting: dict[int, tuple] = {}  # finished before a request added earlier: index -> row
        self._next = 0  # index of the next request to write

    def __call__(self, report: StepReport) -> None:
        if not report.finished:
            return
        waiting = self._waiting
        for view in report.finished:  # read-only views; the record is made from the group behind each
            group = group_of(view)
            waiting[group.index] = row_of(RequestMetrics.of(group))
        append = self.file.append
        while self._next in waiting:
            append(waiting.pop(self._next))
            self._next += 1

    on_steps = __call__  # a steady run's finished groups, ended in its last step, as a step report's

    def close(self) -> RequestTable:
        """Write what is left (requests still waiting for an earlier one, in order) and name the file."""
        for i in sorted(self._waiting):
            self.file.append(self._waiting.pop(i))
        return RequestTable(self.file.close())

    def abandon(self) -> None:
        self.file.abandon()


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
    records have the columns ``FIELDS``; a fleet's table (``cluster/summary.py``) has those first, then its own."""
    if isinstance(records, pa.Table):
        if tuple(records.column_names[: len(FIELDS)]) != FIELDS:
            raise ValueError(f"a table of records starts with the columns {FIELDS}, not {records.column_names}")
        return tuple(records.column_names), batch_rows(records.to_batches())
    return FIELDS, records.rows() if isinstance(records, RequestTable) else map(row_of, records)
