"""The one error a bad workload file raises: where it is (file, line, column) and what is wrong."""

from __future__ import annotations

from kvsched.userfiles.reader import FileError

MAX_REQUESTS = 10_000_000  # a workload's requests at most (each costs about a kilobyte or two of memory)
# The token ids one request carries at most (a prefix trace's prompt, a session's context): a prompt given by its ids
# holds each one (about 36 bytes a token), so a few lines of a file could otherwise ask for gigabytes.
MAX_PROMPT_IDS = 1 << 20


class WorkloadError(FileError):
    """A workload cannot be built; for files, names the file, the 1-based line and the column."""
