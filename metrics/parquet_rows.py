"""A Parquet file written a row group at a time, so a table of millions of rows is never held whole.

Rows (tuples in the schema's column order) are buffered and written as one row group each time
``row_group_size`` of them have arrived. The file is written under ``NAME.partial`` and renamed
to its name by ``close()``, so a reader never finds a half-written table under the real name.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def arrow_table(rows: list[tuple], schema: pa.Schema) -> pa.Table:
    """``rows`` (tuples in column order) as an Arrow table of ``schema``."""
    columns = zip(*rows) if rows else ([] for _ in schema)
    return pa.Table.from_arrays([pa.array(list(c), type=f.type) for c, f in zip(columns, schema)], schema=schema)


class ParquetRows:
    def __init__(self, path: Path, schema: pa.Schema, row_group_size: int = 65_536) -> None:
        self.path = Path(path)
        self.schema = schema
        self.row_group_size = row_group_size
        self._partial = self.path.with_name(self.path.name + ".partial")
        self._writer = pq.ParquetWriter(self._partial, schema)
        self.rows: list[tuple] = []  # buffered, not yet written
        self.num_rows = 0  # written
        self.num_row_groups = 0

    def append(self, row: tuple) -> None:
        self.rows.append(row)
        if len(self.rows) >= self.row_group_size:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            self._writer.write_table(arrow_table(self.rows, self.schema))
            self.num_rows += len(self.rows)
            self.num_row_groups += 1
            self.rows = []

    def close(self) -> Path:
        self.flush()
        self._writer.close()
        os.replace(self._partial, self.path)
        return self.path

    def abandon(self) -> None:
        """Close and remove the partial file (a run that failed)."""
        self._writer.close()
        self._partial.unlink(missing_ok=True)
