"""One writer per run: an OS lock on ``<run>/lock`` while a process trains into the run directory.

The lock is ``flock`` on an open file, so the kernel releases it when the process ends, however it
ends (a SIGKILL leaves no stale lock). The file holds who has it (host, pid, start time) for the
message a second writer gets. :func:`holder` asks, without waiting, whether a process holds it
(what ``theseus runs`` shows as running).
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from theseus.base import jsonfile
from theseus.errors import ConfigError

LOCK_FILE = "lock"
#: Seconds a writer retries a lock it finds taken: a :func:`holder` probe holds it for microseconds.
PROBE_GRACE = 0.5


class RunLock:
    """Held from :meth:`acquire` until :meth:`release` (or the process's end)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        """Take the lock; ConfigError naming the holder when another process writes this run."""
        import fcntl

        fd = _open_own(self.path)
        deadline = time.monotonic() + PROBE_GRACE
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if _still_named(fd, self.path):
                    break
                os.close(fd)  # the file was removed by the writer that had it (discard): take the new one
                fd = _open_own(self.path)
                continue
            except BlockingIOError:
                if time.monotonic() < deadline:  # perhaps only a probe: try again shortly
                    time.sleep(0.02)
                    continue
                holder = _read_holder(fd)
            except OSError:
                holder = _read_holder(fd)
            os.close(fd)
            run = self.path.parent.name
            raise ConfigError(
                f"run {run!r} is being written by {holder}; wait for it to finish or stop it, "
                "or give this one another run/name"
            )
        record = {
            "host": platform.node(),
            "pid": os.getpid(),
            "since": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        self._fd = fd
        return self

    def discard(self) -> None:
        """Remove the lock file, then let go: for a run folder that the failed start of this writer
        created and leaves empty. A writer waiting for the lock meanwhile opens a new file."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()
            self.release()

    def release(self) -> None:
        """Let go: the holder's record is cleared (the file itself stays, empty) and the lock released."""
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing the descriptor releases the lock
            self._fd = None


def _open_own(path: Path) -> int:
    """The lock file opened for writing, created if absent: never through a symbolic link, and only a
    regular file no other name shares (a link to another file would have it truncated). Anything else is
    one ConfigError naming the file."""
    import stat

    problem = "is a symbolic link"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as error:
        if error.errno != errno.ELOOP:
            raise
    else:
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode) and info.st_nlink == 1:
            return fd
        os.close(fd)
        problem = "is not a regular file" if not stat.S_ISREG(info.st_mode) else "is a hard link to another file"
    raise ConfigError(
        f"the run's lock file {path} {problem}, which theseus never makes; remove that name (rm {path}: "
        "what it points to is left alone) and run again"
    )


def _still_named(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (not removed or replaced since it was opened)."""
    try:
        named = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)


def _record(fd: int) -> dict[str, Any]:
    """The holder record in the lock file (empty when there is none or it is unreadable)."""
    try:
        record = jsonfile.parse(os.pread(fd, 4096, 0))
    except (OSError, jsonfile.UnreadableJSON):  # 4 KiB of brackets once raised RecursionError
        return {}
    return record if isinstance(record, dict) else {}


def _read_holder(fd: int) -> str:
    record = _record(fd)
    try:
        return f"process {record['pid']} on {record['host']} (since {record['since']} UTC)"
    except KeyError:
        return "another process"


def _probe(path: Path) -> tuple[bool | None, dict[str, Any]]:
    """``(held, record)`` of the lock file ``path`` without waiting: held is True when a process holds
    the lock, False when none does (or there is no lock file), None when the file system cannot tell."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return False, {}
    except OSError:
        return None, {}
    try:
        record = _record(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True, record
        except OSError:
            return None, record
        return False, record  # closing the descriptor lets go of the shared lock at once
    finally:
        os.close(fd)


def holder(run_dir: Path) -> dict[str, Any] | None:
    """Who writes ``run_dir`` now: its lock's holder record (``host``, ``pid``, ``since``; empty if it has
    not written one yet), or None when no process holds the lock or the file system cannot tell."""
    held, record = _probe(Path(run_dir) / LOCK_FILE)
    return record if held else None


def abandoned(run_dir: Path) -> bool:
    """Whether ``run_dir`` was being written by a process that has ended without letting go: its lock
    file names a holder, yet no process holds the lock. Never true while a writer is alive, nor
    when the file system cannot tell."""
    held, record = _probe(Path(run_dir) / LOCK_FILE)
    return held is False and bool(record)


def remove_abandoned(parent: Path, pattern: str) -> list[Path]:
    """Remove the folders in ``parent`` matching ``pattern`` (staging folders, each locked by its writer)
    that were :func:`abandoned` by a writer killed midway; folders being written stay. Returns those removed."""
    import shutil

    removed = []
    for folder in sorted(Path(parent).glob(pattern)):
        if folder.is_dir() and abandoned(folder):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def publish(staging: Path, final: Path) -> bool:
    """Rename the complete folder ``staging`` to ``final`` in one step; False (``staging`` left as it is)
    when ``final`` has been taken meanwhile: a folder with anything in it, or a file. An empty folder is
    replaced. The rename itself decides, so of two writers racing for one ``final`` exactly one wins and
    the other's folder never mixes with, nor replaces, the winner's."""
    try:
        os.rename(staging, final)
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
            return False
        raise
    return True


__all__ = ["LOCK_FILE", "RunLock", "abandoned", "holder", "publish", "remove_abandoned"]
