"""One writer per run: an OS lock on ``<run>/lock`` while a process trains into the run directory.

The lock is ``flock`` on an open file, so the kernel releases it when the process ends, however it
ends (a SIGKILL leaves no stale lock). The file holds who has it (host, pid, start time) for the
message a second writer gets.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
from pathlib import Path

from theseus.errors import ConfigError

LOCK_FILE = "lock"


class RunLock:
    """Held from :meth:`acquire` until :meth:`release` (or the process's end)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        """Take the lock; ConfigError naming the holder when another process writes this run."""
        import fcntl

        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _read_holder(fd)
            os.close(fd)
            run = self.path.parent.name
            raise ConfigError(
                f"run {run!r} is being written by {holder}; wait for it to finish or stop it, "
                "or give this one another run/name"
            ) from None
        record = {
            "host": platform.node(),
            "pid": os.getpid(),
            "since": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Let go: the holder's record is cleared (the file itself stays, empty) and the lock released."""
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing the descriptor releases the lock
            self._fd = None


def _read_holder(fd: int) -> str:
    try:
        record = json.loads(os.pread(fd, 4096, 0).decode("utf-8"))
        return f"process {record['pid']} on {record['host']} (since {record['since']} UTC)"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


__all__ = ["LOCK_FILE", "RunLock"]
