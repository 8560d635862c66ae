"""Reading the files a user gives (workload specs, cost profiles, traces, results folders): whatever
is wrong with one, unreadable, not UTF-8, not JSON, nested too deeply, is a ``FileError`` naming
the file and the line (and the column or key), never a decoder's bare message."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvsched.errors import KvschedError

BOM = b"\xef\xbb\xbf"  # the byte-order mark spreadsheet exports put first: dropped


def located(message: str, path: Path | str | None = None, line: int | None = None, column: str | None = None) -> str:
    """``path:line: column 'c': message``, with what is known of the place."""
    if path is None:
        return message
    return (
        f"{path}"
        + (f":{line}" if line is not None else "")
        + (f": column {column!r}" if column is not None else "")
        + f": {message}"
    )


class FileError(KvschedError):
    """A file cannot be read as what it should be; names the file, the 1-based line and the column or key."""

    def __init__(
        self, message: str, path: Path | str | None = None, line: int | None = None, column: str | None = None
    ) -> None:
        super().__init__(located(message, path, line, column))
        self.path, self.line, self.column = path, line, column


def _not_utf8(raw: bytes, at: int, path: Path | str, line: int = 1) -> FileError:
    """The error for the byte ``raw[at]`` that is not UTF-8 (``line``: the line ``raw`` starts on)."""
    start = raw.rfind(b"\n", 0, at) + 1
    return FileError(
        f"not UTF-8 text: byte 0x{raw[at]:02x} at column {at - start + 1}", path, line + raw.count(b"\n", 0, at)
    )


def _unreadable(exc: OSError, path: Path | str, what: str) -> FileError:
    return FileError(f"cannot read {what}: {exc.strerror or exc}", path)


def read_text(path: Path | str, what: str = "file") -> str:
    """The file as text (UTF-8)."""
    try:
        raw = Path(path).read_bytes().removeprefix(BOM)
    except OSError as exc:
        raise _unreadable(exc, path, what) from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _not_utf8(raw, exc.start, path) from None


def read_json(path: Path | str, what: str = "file") -> Any:
    """The file's JSON value; a syntax error names its line, nesting too deep for the parser is one error too."""
    text = read_text(path, what)
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise FileError(f"not valid JSON: {exc.msg} (column {exc.colno})", path, exc.lineno) from None
    except (RecursionError, ValueError) as exc:  # ValueError: an integer of more digits than Python converts
        raise FileError(
            "not valid JSON: nested too deeply" if isinstance(exc, RecursionError) else f"not valid JSON: {exc}", path
        ) from None


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number (write a number, or null)")


def text_lines(path: Path | str, what: str = "file") -> Iterator[str]:
    """The file's lines (line ends kept, as ``csv`` wants them), decoded one at a time so that a long
    trace is never all in memory as text; a line that is not UTF-8 names its number."""
    try:
        handle = Path(path).open("rb")
    except OSError as exc:
        raise _unreadable(exc, path, what) from None
    with handle:
        for n, raw in enumerate(handle, start=1):
            raw = raw.removeprefix(BOM) if n == 1 else raw
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise _not_utf8(raw, exc.start, path, n) from None
