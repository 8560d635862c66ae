"""The one error a bad workload file raises: where it is (file, line, column) and what is wrong."""

from __future__ import annotations

from kvsched.core.files import FileError

MAX_REQUESTS = 10_000_000  # a workload's requests at most (each costs about a kilobyte or two of memory)


class WorkloadError(FileError):
    """A workload cannot be built; for files, names the file, the 1-based line and the column."""
