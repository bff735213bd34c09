"""Writing the files of a run, a dataset or an output folder without following links: a file is replaced
whole through a new file beside it, renamed over a regular file only, and appended to only where it is a
regular file opened without following a link. A link, a folder or a device at a path theseus writes is one
:class:`~theseus.errors.ConfigError` naming it, and is left as it is (with whatever it points to).
No jax import."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path
from typing import IO, Any

from theseus.errors import ConfigError


def _refuse(path: Path, info: os.stat_result) -> ConfigError:
    kind = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a regular file"
    return ConfigError(
        f"{str(path)!r} is {kind}, which theseus does not write through; move it away, or write to another name"
    )


def _check_regular(path: Path) -> None:
    """Nothing at ``path``, or a regular file (not a link to one)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(info.st_mode):
        raise _refuse(path, info)


def replace_file(path: str | Path, data: str | bytes, encoding: str = "utf-8") -> None:
    """Write ``data`` to ``path`` at once for readers: into a new file beside it (created, never opened
    through an existing name or link), renamed over ``path``. Only a regular file is replaced."""
    path = Path(path)
    _check_regular(path)
    partial = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode(encoding) if isinstance(data, str) else data)
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise


def open_append(path: str | Path, encoding: str = "utf-8") -> IO[Any]:
    """``path`` opened to append text (created when missing), never through a link, a regular file only."""
    path = Path(path)
    _check_regular(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    except OSError as exc:
        if exc.errno != errno.ELOOP:  # not a link made between the check and the open: as the system says
            raise
        raise _refuse(path, os.lstat(path)) from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _refuse(path, os.lstat(path))
    return os.fdopen(fd, "a", encoding=encoding)


__all__ = ["open_append", "replace_file"]
