"""The one error a bad workload file raises: where it is (file, line, column) and what is wrong."""

from __future__ import annotations

from pathlib import Path

from kvsched.core.errors import KvschedError

MAX_REQUESTS = 10_000_000  # a workload's requests at most (each costs about a kilobyte or two of memory)


class WorkloadError(KvschedError):
    """A workload cannot be built; for files, names the file, the 1-based line and the column."""

    def __init__(self, message: str, path: Path | str | None = None, line: int | None = None, column: str | None = None) -> None:
        where = ""
        if path is not None:
            where = str(path) + (f":{line}" if line is not None else "")
            where += f": column {column!r}" if column is not None else ""
            where += ": "
        super().__init__(where + message)
        self.path, self.line, self.column = path, line, column
