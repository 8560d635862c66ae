"""Where results go: checked before a run (so that a bad path fails in a second, not after the
simulation), and written atomically after it (so that a failed write leaves nothing half-done).

A results folder is built in a hidden folder beside it and moved in when complete: a new folder
appears whole, and in an existing one the result files of an earlier run (``names``) are
replaced together, so no old ``report.html`` or plot stays beside a new summary. Other files in
the folder are left alone. A single file is written beside its destination and renamed over it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from kvsched.core.errors import KvschedError

RUN_FILES = ("summary.json", "requests.csv", "requests.parquet", "timeseries.parquet", "decisions.parquet", "report.html",
             "trace.json", "latency_cdf.png", "queues_kv.png", "batch_composition.png")
SWEEP_FILES = ("sweep.csv", "sweep.parquet", "tradeoff.png")
COMPARE_FILES = ("comparison.csv", "comparison_cdf.png")


class OutputError(KvschedError):
    """Results cannot be written where the user asked."""


def check_folder(folder: Path, names: Iterable[str] = RUN_FILES, option: str = "--output") -> None:
    """Raise ``OutputError`` unless a results folder can be written at ``folder``."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise OutputError(f"{option} {folder}: is a file, not a folder")
    for name in names:
        if (folder / name).is_dir():
            raise OutputError(f"{option} {folder}: {name} there is a folder, where a result file would go")
    _check_writable(folder, option)


def check_file(path: Path, option: str) -> None:
    """Raise ``OutputError`` unless a file can be written at ``path``."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"{option} {path}: is a folder, not a file")
    _check_writable(path.parent, option, path)


def _check_writable(folder: Path, option: str, shown: Path | None = None) -> None:
    """Create (and remove) a probe in the nearest existing ancestor of ``folder``: only a real write
    tells, for every user and file system (root ignores permission bits, /proc refuses anything)."""
    base = folder
    while not base.exists() and base != base.parent:
        base = base.parent
    where = f"{option} {shown or folder}"
    if not base.is_dir():
        raise OutputError(f"{where}: {base} is a file, so nothing can be written under it")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".kvsched-probe-", dir=base))
    except OSError as exc:
        raise OutputError(f"{where}: cannot write under {base}: {exc.strerror or exc}") from None


@contextmanager
def publishing_folder(folder: Path, names: Iterable[str] = RUN_FILES) -> Iterator[Path]:
    """Yield a staging folder to write results into; on success they replace ``names`` in ``folder``."""
    folder = Path(folder)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=f".{folder.name or 'results'}.", dir=folder.parent))
    except OSError as exc:
        raise OutputError(f"cannot write results to {folder}: {exc.strerror or exc}") from None
    try:
        yield stage
        if not folder.exists():
            os.chmod(stage, 0o777 & ~_umask())  # mkdtemp made it private
            os.rename(stage, folder)
            return
        for name in names:
            (folder / name).unlink(missing_ok=True)
        for path in stage.iterdir():
            os.replace(path, folder / path.name)
    except OSError as exc:
        raise OutputError(f"cannot write results to {folder}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)


@contextmanager
def publishing_file(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` to write; on success it is renamed to ``path``."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=path.suffix, dir=path.parent)
        os.close(fd)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        yield Path(temp)
        os.chmod(temp, 0o666 & ~_umask())  # mkstemp made it private
        os.replace(temp, path)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        Path(temp).unlink(missing_ok=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
