"""A Parquet file written a row group at a time, so a table of millions of rows is never held whole.

Rows (tuples in the schema's column order) are buffered and written as one row group each time
``row_group_size`` of them have arrived. The file is written under ``NAME.partial`` and renamed
to its name by ``close()``, so a reader never finds a half-written table under the real name.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def arrow_table(rows: list[tuple], schema: pa.Schema) -> pa.Table:
    """``rows`` (tuples in column order) as an Arrow table of ``schema``."""
    columns = zip(*rows) if rows else ([] for _ in schema)
    return pa.Table.from_arrays([pa.array(c, type=f.type) for c, f in zip(columns, schema)], schema=schema)


class ParquetRows:
    """Rows appended one at a time, written a row group at a time; ``on_write`` sees each group written.

    ``dictionary=False`` skips Parquet's dictionary encoding, which costs more than it saves on
    numeric columns (a time series: a third of the writing time).
    """

    def __init__(
        self,
        path: Path,
        schema: pa.Schema,
        row_group_size: int = 65_536,
        on_write: Callable[[pa.Table], None] | None = None,
        dictionary: bool = True,
    ) -> None:
        self.path = Path(path)
        self.schema = schema
        self.row_group_size = row_group_size
        self._partial = self.path.with_name(self.path.name + ".partial")
        self._writer = pq.ParquetWriter(self._partial, schema, use_dictionary=dictionary)
        self.on_write = on_write
        self.rows: list[tuple] = []  # buffered, not yet written
        self.num_rows = 0  # written
        self.num_row_groups = 0

    def append(self, row: tuple) -> None:
        self.rows.append(row)
        if len(self.rows) >= self.row_group_size:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            self.write(arrow_table(self.rows, self.schema))
            self.rows = []

    def write(self, table: pa.Table) -> None:
        """Write ``table`` (of this schema) as the next row group."""
        self._writer.write_table(table)
        if self.on_write is not None:
            self.on_write(table)
        self.num_rows += table.num_rows
        self.num_row_groups += 1

    def close(self) -> Path:
        self.flush()
        self._writer.close()
        os.replace(self._partial, self.path)
        return self.path

    def abandon(self) -> None:
        """Close and remove the partial file (a run that failed)."""
        self._writer.close()
        self._partial.unlink(missing_ok=True)
