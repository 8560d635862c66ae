"""Reading a results folder back (``engine explain``, ``engine compare``, the report): a damaged file,
a ``summary.json`` that is not JSON or lacks a key, a Parquet file without its columns, a cell that
is not a number, is one ``FileError`` naming the file and the key, column or line, checked as the
file is read, so that nothing later trips over it with a bare ``KeyError``.

Shapes of JSON are dicts of key -> what the value must be: ``float`` (any finite number), ``int``,
``str``, ``dict``, a nested shape, a list of one shape (``[shape]``: a list of such objects), or a
tuple of these (``None`` in it: the value may be null).
"""

from __future__ import annotations

import csv
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvsched.errors import quote
from kvsched.userfiles.reader import FileError, read_json, text_lines

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

_NAMES = {float: "a finite number", int: "an integer below 2**63", str: "a string", dict: "an object", None: "null"}


def read_summary(path: Path, shape: dict[str, Any]) -> dict:
    """``summary.json``: a JSON object holding at least ``shape``."""
    data = read_json(path, "summary")
    check_shape(data, shape, path)
    return data


def check_shape(data: Any, shape: dict[str, Any], path: Path, where: str = "") -> None:
    if not isinstance(data, dict):
        raise FileError(f"{f'key {where!r}' if where else 'the file'} holds {quote(data)}, expected an object", path)
    for key, kind in shape.items():
        name = f"{where}.{key}" if where else key
        if key not in data:
            raise FileError(f"no key {name!r}: not a summary written by engine run or engine bench", path)
        value, kinds = data[key], kind if isinstance(kind, tuple) else (kind,)
        nested = next((k for k in kinds if isinstance(k, dict)), None)
        items = next((k[0] for k in kinds if isinstance(k, list)), None)
        if nested is not None and isinstance(value, dict):
            check_shape(value, nested, path, name)
        elif items is not None and isinstance(value, list):
            for i, item in enumerate(value):
                check_shape(item, items, path, f"{name}[{i}]")
        elif not any(_is(value, k) for k in kinds if not isinstance(k, (dict, list))):
            wanted = " or ".join(
                "an object" if isinstance(k, dict) else "a list" if isinstance(k, list) else _NAMES[k] for k in kinds
            )
            raise FileError(f"key {name!r} holds {quote(value)}, expected {wanted}", path)


def _is(value: Any, kind: type | None) -> bool:
    if kind is None:
        return value is None
    if isinstance(value, bool):
        return False
    if kind is float:
        return isinstance(value, (int, float)) and abs(value) <= sys.float_info.max  # finite, and a float can hold it
    if kind is int:
        return isinstance(value, int) and -(2**63) <= value < 2**63  # a count, as the run's int64 columns hold them
    return isinstance(value, kind)


def read_table(path: Path, schema: pa.Schema) -> pd.DataFrame:
    """A Parquet file of the results with at least ``schema``'s columns, each of its kind (numbers,
    strings; a column of nulls fits either)."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        found = pq.read_schema(path)
    except (OSError, pa.ArrowException) as exc:
        raise _not_parquet(exc, path) from None
    for field in schema:
        if field.name not in found.names:
            raise FileError(
                f"no column {field.name!r}, which engine run writes (an older version's results? run it again)", path
            )
        got = found.field(field.name).type
        if not _fits(got, field.type):
            raise FileError(
                f"holds {got}, expected {'numbers' if _numeric(field.type) else field.type}", path, column=field.name
            )
    try:
        return pd.read_parquet(path)
    except (OSError, pa.ArrowException) as exc:  # a footer that reads, pages that do not
        raise _not_parquet(exc, path) from None


def _not_parquet(exc: Exception, path: Path) -> FileError:
    return FileError(f"not a readable Parquet file ({str(exc).strip() or type(exc).__name__})", path)


def _numeric(t: pa.DataType) -> bool:
    import pyarrow as pa

    return pa.types.is_integer(t) or pa.types.is_floating(t)


def _fits(got: pa.DataType, wanted: pa.DataType) -> bool:
    import pyarrow as pa

    if pa.types.is_dictionary(got):
        got = got.value_type
    if pa.types.is_null(got):
        return True
    if _numeric(wanted):
        return _numeric(got)
    return pa.types.is_string(got) or pa.types.is_large_string(got) if pa.types.is_string(wanted) else got == wanted


def read_numbers(path: Path, columns: tuple[str, ...]) -> dict[str, list[float]]:
    """The finite numbers in ``columns`` of a CSV file (empty cells skipped: a request that never
    got that far); a file with no rows may lack the columns (an empty run writes only a header)."""
    out: dict[str, list[float]] = {c: [] for c in columns}
    for line, cells in _rows(path, columns):
        for column, cell in zip(columns, cells):
            if cell:
                out[column].append(_finite(cell, path, line, column))
    return out


def _rows(path: Path, columns: tuple[str, ...]) -> Iterator[tuple[int, list[str]]]:
    """Each row of a CSV file as (its line, its stripped cells of ``columns``), checked as it is read:
    as many fields as the header, which names every column (asked at the first row: a file with no
    rows may lack them)."""
    reader = csv.reader(text_lines(path, "results table"))
    try:
        header = [h.strip() for h in next(reader, [])]
        index: list[int] = []
        for row in reader:
            if len(row) != len(header):
                raise FileError(f"expected {len(header)} fields, got {len(row)}", path, reader.line_num)
            if not index:
                missing = [c for c in columns if c not in header]
                if missing:
                    raise FileError(f"no column {missing[0]!r}: not written by engine run or engine bench", path, 1)
                index = [header.index(c) for c in columns]
            yield reader.line_num, [row[i].strip() for i in index]
    except csv.Error as exc:
        raise FileError(f"not a CSV file ({exc})", path, reader.line_num) from None


def read_csv(path: Path, schema: pa.Schema, required: tuple[str, ...] = ()) -> pa.Table:
    """``schema``'s columns of a CSV file of the results, each of its type, the ``required`` ones
    without an empty cell. pyarrow reads it; a file it cannot read is read again line by line, to
    say where: file, line and column."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv

    try:
        options = pacsv.ConvertOptions(column_types=schema, include_columns=schema.names)
        table = pacsv.read_csv(path, convert_options=options)
    except (OSError, pa.ArrowException) as exc:  # what is wrong, and where (the reading raises it, or says it)
        said = str(exc).strip() or type(exc).__name__
        raise _misfit(path, schema) or FileError(f"not a readable CSV file ({said})", path) from None
    for name in required:
        if table[name].null_count:
            line = 2 + pc.index(pc.is_null(table[name]), True).as_py()  # one line a row, after the header
            raise FileError("an empty cell, where engine run writes a value", path, line, name)
    return table


def _misfit(path: Path, schema: pa.Schema) -> FileError | None:
    """The first cell of a CSV file that is not of its column's type in ``schema`` (None if there is none)."""
    import pyarrow as pa

    for line, cells in _rows(path, tuple(schema.names)):
        for field, cell in zip(schema, cells):
            if not cell or not _numeric(field.type):
                continue
            integer = pa.types.is_integer(field.type)
            try:
                number = int(cell) if integer else float(cell)
            except ValueError:
                number = None
            if number is None or (integer and not -(2**63) <= number < 2**63):
                wanted = "an integer" if integer else "a number"
                return FileError(f"{quote(cell)} is not {wanted}", path, line, field.name)
    return None


def _finite(cell: str, path: Path, line: int, column: str) -> float:
    try:
        value = float(cell)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise FileError(f"not a finite number: {quote(cell)}", path, line, column)
    return value
