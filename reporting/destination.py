"""Where results go: checked before a run (so that a bad path fails in a second, not after the
simulation), and written atomically after it (so that a failed write leaves nothing half-done).

A results folder is built in a hidden folder beside it and moved in when complete: a new folder
appears whole, and an existing one is swapped for the new one in one step (``renameat2``'s
exchange, or two renames where the file system has none), so that a failure or a kill at any
point leaves the old results or the new ones, whole, never a mix or neither. (The folder the
command runs in, ``-o .``, is not swapped, which would leave the shell in a removed folder: each
new file replaces its old one instead, so none is ever missing, the old ones kept aside until all are
replaced, so that a failure half-way puts them back.) Files in the folder
that are not results of an earlier run (``names``) are kept: linked into the new folder before the
swap (moved after it, what cannot be linked). A single file is written beside its destination
and renamed over it. Symbolic links are followed: the results go where the link points.

Before the run, ``check_apart`` checks every output of a command against its inputs and its other
outputs (the same file under another name, through a link, included): ``--trace-out`` cannot be
the run's own ``requests.csv``, nor the trace it replays.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from kvsched.errors import KvschedError

# inference-perf's report files (an inference-perf workload's run): the summary and one per load stage
LIFECYCLE_FILES = ("summary_lifecycle_metrics.json", *(f"stage_{i}_lifecycle_metrics.json" for i in range(100)))
RUN_FILES = (
    "summary.json",
    "requests.csv",
    "requests.parquet",
    "timeseries.parquet",
    "decisions.parquet",
    "report.html",
    "trace.json",
    "latency_cdf.png",
    "queues_kv.png",
    "batch_composition.png",
    *LIFECYCLE_FILES,
)
SWEEP_FILES = ("sweep.csv", "sweep.parquet", "tradeoff.png")
COMPARE_FILES = ("comparison.csv", "comparison_cdf.png")
FLEET_FILES = ("summary.json", "requests.csv", "routes.csv", "report.html")  # a fleet's (engine run --replicas)


class OutputError(KvschedError):
    """Results cannot be written where the user asked."""


def check_folder(folder: Path, names: Iterable[str] = RUN_FILES, option: str = "--output") -> None:
    """Raise ``OutputError`` unless a results folder can be written at ``folder``."""
    folder = Path(folder)
    _check_link(folder, option)
    if folder.exists() and not folder.is_dir():
        raise OutputError(f"{option} {folder}: is a file, not a folder")
    for name in names:
        if (folder / name).is_dir():
            raise OutputError(f"{option} {folder}: {name} there is a folder, where a result file would go")
    _check_writable(folder, option)


def check_file(path: Path, option: str) -> None:
    """Raise ``OutputError`` unless a file can be written at ``path``."""
    path = Path(path)
    _check_link(path, option)
    if path.is_dir():
        raise OutputError(f"{option} {path}: is a folder, not a file")
    _check_writable(path.parent, option, path)


def check_apart(outputs: dict[str, tuple[Path | None, Iterable[str] | None]], inputs: dict[str, Path | None]) -> None:
    """Raise ``OutputError`` where an output of a command would overwrite one of its inputs or another
    of its outputs. ``outputs``: option -> (path, the names written under it for a folder, None for
    a file); ``inputs``: option -> a file it reads. None paths are skipped."""
    written: list[tuple[str, Path, str | None]] = []  # (option, path, the result's name in a folder)
    for option, (path, names) in outputs.items():
        if path is not None:
            written.append((option, Path(path), None))
            written += [(option, Path(path) / name, name) for name in names or ()]
    for option, path, name in written:
        for other, source in inputs.items():
            if source is not None and _same(path, Path(source)):
                raise OutputError(
                    f"{option} {path.parent if name else path}: {f'its {name} ' if name else ''}would overwrite "
                    f"{other} {source}, which the command reads; write it elsewhere"
                )
        for other, path2, name2 in written:
            if other != option and not (name and name2) and _same(path, path2):
                where = f"where {option} {path.parent} writes {name}" if name else f"the {option} path too"
                raise OutputError(f"{other} {path2}: is {where}; give each output its own path")


def _same(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` are one file (or would be once written): the same inode where both exist
    (hard links, a case-insensitive file system), else the same path with every link followed."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.normcase(os.path.realpath(a)) == os.path.normcase(os.path.realpath(b))


def _check_link(path: Path, option: str) -> None:
    """A link that leads nowhere (the path, or a folder above it) cannot be written through."""
    for p in (path, *path.parents):
        if p.is_symlink() and not p.exists():
            raise OutputError(f"{option} {path}: {p} is a symbolic link to {os.readlink(p)}, which does not exist")


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
    """Yield a staging folder to write results into; on success it takes the place of ``folder`` whole,
    with what else was there (everything but ``names``) kept."""
    shown, folder = Path(folder), Path(os.path.realpath(folder))  # a link: the results go where it points
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=f".{folder.name or 'results'}.", dir=folder.parent))
    except OSError as exc:
        raise OutputError(f"cannot write results to {shown}: {exc.strerror or exc}") from None
    remove = True  # the stage, at the end: not when it holds the old folder's files that could not be moved
    try:
        yield stage
        if not folder.exists():
            os.chmod(stage, 0o777 & ~_umask())  # mkdtemp made it private
            os.rename(stage, folder)
            return
        os.chmod(stage, stat.S_IMODE(folder.stat().st_mode))
        if _runs_in(folder):  # swapped, the folder the user's shell is in would be a removed one: file by file
            _replace_files(stage, folder, set(names))
            return
        later = _link_others(folder, stage, set(names))
        if not _swap(stage, folder):  # a mount point
            _replace_files(stage, folder, set(names))
            return
        remove = False  # the stage is now the old folder: what could not be linked moves to the new one
        for name in later:
            os.rename(stage / name, folder / name)
        remove = True
    except OSError as exc:
        kept = "" if remove else f" (the earlier folder's other files are in {stage})"
        raise OutputError(f"cannot write results to {shown}: {exc.strerror or exc}{kept}") from None
    finally:
        if remove:
            shutil.rmtree(stage, ignore_errors=True)


def _replace_files(stage: Path, folder: Path, names: set[str]) -> None:
    """Where ``folder`` is not swapped (a mount point, the folder the command runs in): each new file
    over its old one, so that no result is ever missing, then the old results the new run did not
    write are removed. The old results are hard-linked aside first: a replace that fails half-way
    (a result's name taken by a folder, a file that cannot be replaced) puts them all back, and removes
    the new ones, so that the folder holds the old results or the new ones, never a mix."""
    new = {p.name for p in stage.iterdir()}
    old = {name for name in names | new if os.path.isfile(folder / name) and not os.path.islink(folder / name)}
    aside = Path(tempfile.mkdtemp(prefix=".kvsched-old-", dir=folder))  # beside them: the same file system
    try:
        for name in old:
            _keep(folder / name, aside / name)
        try:
            for name in new:
                os.replace(stage / name, folder / name)
            for name in names - new:
                (folder / name).unlink(missing_ok=True)
        except OSError:
            for name in new - old:
                if os.path.isfile(folder / name):
                    (folder / name).unlink(missing_ok=True)
            for name in old:
                os.replace(aside / name, folder / name)
            raise
    finally:
        shutil.rmtree(aside, ignore_errors=True)


def _keep(path: Path, copy: Path) -> None:
    """``path``'s content also at ``copy``: a hard link (no copying), or a copy where the file system has none."""
    try:
        os.link(path, copy)
    except OSError:
        shutil.copy2(path, copy)


def _runs_in(folder: Path) -> bool:
    """Whether this process (so, most likely, the shell that started it) is in ``folder`` or below it."""
    try:
        here = os.getcwd()
    except OSError:
        return False
    return os.path.commonpath([here, folder]) == str(folder)


def _link_others(folder: Path, stage: Path, names: set[str]) -> list[str]:
    """Hard-link into ``stage`` what ``folder`` holds besides results (``names``) and the new files;
    returns the names that cannot be linked (folders; a file system without links), to move later."""
    later = []
    for entry in os.scandir(folder):
        if entry.name in names or os.path.lexists(stage / entry.name):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                raise IsADirectoryError
            os.link(entry.path, stage / entry.name, follow_symlinks=False)
        except OSError:
            later.append(entry.name)
    return later


RENAME_EXCHANGE = 2


@functools.cache
def _renameat2():
    """Linux's ``renameat2``, which exchanges two paths in one step, or None where the C library has none."""
    try:
        return ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError, TypeError):  # TypeError: Windows loads no library by None
        return None


def _swap(new: Path, folder: Path) -> bool:
    """Put ``new`` where ``folder`` is and ``folder`` where ``new`` was: in one step where the file
    system can; else by two renames, the old folder whole under a hidden name between them. False
    where ``folder`` cannot be renamed at all (a mount point)."""
    exchange = _renameat2()
    if exchange is not None:
        if exchange(-100, os.fsencode(new), -100, os.fsencode(folder), RENAME_EXCHANGE) == 0:  # -100: AT_FDCWD
            return True
        err = ctypes.get_errno()
        if err in (errno.EBUSY, errno.EXDEV):
            return False
        if err not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):  # else no exchange on this file system
            raise OSError(err, os.strerror(err), str(folder))
    aside = new.with_name(new.name + ".old")
    try:
        os.rename(folder, aside)
    except OSError as exc:
        if exc.errno in (errno.EBUSY, errno.EXDEV):
            return False
        raise
    try:
        os.rename(new, folder)
    except OSError:
        os.rename(aside, folder)
        raise
    os.rename(aside, new)
    return True


@contextmanager
def publishing_file(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` to write; on success it is renamed to ``path`` (to the
    file a link there points to: the link stays)."""
    path = Path(os.path.realpath(path))
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
