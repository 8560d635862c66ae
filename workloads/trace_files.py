"""Reading trace CSVs: the Azure LLM inference format, the plain format, and length-only files.

Formats are recognised by their header:

- Azure: ``TIMESTAMP,ContextTokens,GeneratedTokens`` with ``TIMESTAMP`` as
  ``YYYY-MM-DD HH:MM:SS[.fffffff]`` (arrival times become seconds after the first row);
- plain: ``arrival_time_s,prompt_tokens,output_tokens[,priority,tenant]``;
- lengths: ``num_prefill_tokens,num_decode_tokens[,...]`` (ShareGPT-stats; no arrival times).

Every row is validated; the first bad cell raises ``WorkloadError`` with file, line and column.
Nothing is skipped silently.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from kvsched.core.request import MAX_TOKENS
from kvsched.errors import quote
from kvsched.userfiles.reader import text_lines
from kvsched.workloads.errors import WorkloadError

AZURE = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
PLAIN = ("arrival_time_s", "prompt_tokens", "output_tokens")
PLAIN_OPTIONAL = ("priority", "tenant")
LENGTHS = ("num_prefill_tokens", "num_decode_tokens")


@dataclass(frozen=True, slots=True)
class TraceRow:
    arrival_time: float | None  # seconds; None for length-only files
    prompt_tokens: int
    output_tokens: int
    priority: int = 0
    tenant: str = "default"


def detect_format(header: list[str]) -> str:
    cols = set(header)
    if set(AZURE) <= cols:
        return "azure"
    if set(PLAIN) <= cols:
        return "plain"
    if set(LENGTHS) <= cols:
        return "lengths"
    raise ValueError


def read_trace(path: Path | str) -> tuple[str, list[TraceRow]]:
    """``(format, rows)`` of a trace CSV, in file order."""
    path = Path(path)
    reader = csv.reader(text_lines(path, "trace"))  # a line that is not UTF-8 is a FileError naming it
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise WorkloadError("empty file: expected a header row", path, 1) from None
    except csv.Error as exc:
        raise WorkloadError(f"not a CSV file ({exc})", path, 1) from None
    twice = sorted({h for h in header if header.count(h) > 1})
    if twice:
        raise WorkloadError(f"column(s) {', '.join(map(repr, twice))} appear more than once in the header", path, 1)
    try:
        fmt = detect_format(header)
    except ValueError:
        raise WorkloadError(
            f"unknown header {','.join(header)!r}; expected {','.join(AZURE)} (Azure), "
            f"{','.join(PLAIN)}[,priority,tenant] (plain) or {','.join(LENGTHS)} (lengths)",
            path,
            1,
        ) from None
    parse = _ROW_PARSERS[fmt]
    col = {name: i for i, name in enumerate(header)}
    rows: list[TraceRow] = []
    t0: list[datetime] = []
    line = 1
    try:
        for line, row in enumerate(reader, start=2):
            if not row or (len(row) == 1 and not row[0].strip()):
                raise WorkloadError("empty row", path, line)
            if len(row) != len(header):
                raise WorkloadError(f"expected {len(header)} fields, got {len(row)}", path, line)
            rows.append(parse(row, col, path, line, t0))
    except csv.Error as exc:
        raise WorkloadError(f"unreadable row ({exc})", path, line + 1) from None
    if not rows:
        raise WorkloadError("no requests: the file has a header but no rows", path, 2)
    return fmt, rows


def _int(row, col, name, path, line, minimum: int, maximum: int = MAX_TOKENS) -> int:
    cell = row[col[name]].strip()
    try:
        value = int(cell)
    except ValueError:
        try:
            f = float(cell)
        except ValueError:
            raise WorkloadError(f"not an integer: {quote(cell)}", path, line, name) from None
        if not f.is_integer():
            raise WorkloadError(f"not an integer: {quote(cell)}", path, line, name) from None
        value = int(f)
    if not minimum <= value <= maximum:
        raise WorkloadError(
            f"must be >= {minimum}, got {quote(cell)}"
            if value < minimum
            else f"must be <= {maximum}, got {quote(cell)}",
            path,
            line,
            name,
        )
    return value


def _timestamp(cell: str, path, line) -> datetime:
    whole, _, frac = cell.strip().partition(".")
    try:
        t = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S")
        if frac:
            if not frac.isdigit():
                raise ValueError
            t = t.replace(microsecond=int((frac + "000000")[:6]))
    except ValueError:
        raise WorkloadError(
            f"not a timestamp YYYY-MM-DD HH:MM:SS.fffffff: {quote(cell)}", path, line, "TIMESTAMP"
        ) from None
    return t


def _azure(row, col, path, line, t0: list[datetime]) -> TraceRow:
    t = _timestamp(row[col["TIMESTAMP"]], path, line)
    if not t0:
        t0.append(t)
    offset = (t - t0[0]).total_seconds()
    if offset < 0:
        raise WorkloadError(
            f"timestamp {row[col['TIMESTAMP']].strip()!r} precedes the first row's", path, line, "TIMESTAMP"
        )
    return TraceRow(
        offset,
        _int(row, col, "ContextTokens", path, line, 1),
        _int(row, col, "GeneratedTokens", path, line, 1),
    )


def _plain(row, col, path, line, _t0) -> TraceRow:
    cell = row[col["arrival_time_s"]].strip()
    try:
        t = float(cell)
    except ValueError:
        raise WorkloadError(f"not a number: {quote(cell)}", path, line, "arrival_time_s") from None
    if not math.isfinite(t) or t < 0:
        raise WorkloadError(f"must be a finite time >= 0, got {quote(cell)}", path, line, "arrival_time_s")
    prio = _int(row, col, "priority", path, line, -(1 << 31), (1 << 31) - 1) if "priority" in col else 0
    tenant = row[col["tenant"]].strip() if "tenant" in col else "default"
    if "tenant" in col and not tenant:
        raise WorkloadError("empty tenant", path, line, "tenant")
    return TraceRow(
        t,
        _int(row, col, "prompt_tokens", path, line, 1),
        _int(row, col, "output_tokens", path, line, 1),
        prio,
        tenant,
    )


def _lengths(row, col, path, line, _t0) -> TraceRow:
    return TraceRow(
        None,
        _int(row, col, "num_prefill_tokens", path, line, 1),
        _int(row, col, "num_decode_tokens", path, line, 1),
    )


_ROW_PARSERS = {"azure": _azure, "plain": _plain, "lengths": _lengths}
