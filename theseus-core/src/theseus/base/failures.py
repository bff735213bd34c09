"""What the machine refuses a job, as one line: a read-only or forbidden path, a full disk, no memory.

``theseus run`` runs every job inside :func:`one_line_failures`. An ``OSError`` with ``EROFS``,
``EACCES``, ``EPERM``, ``ENOSPC`` or ``EDQUOT``, a ``MemoryError`` or an XLA out-of-memory error
that escapes the job becomes a :class:`~theseus.errors.ResourceError` naming the path (or the
configuration keys that set the size) and the fix. Errors the job already reported as a
:class:`~theseus.errors.TheseusError` (a checkpoint save that ran out of space, data preparation on
a full disk) pass through unchanged; anything else keeps its traceback.
"""

from __future__ import annotations

import errno
import io
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

from theseus.errors import ResourceError

#: errno -> (what went wrong with a path, the fix for the place holding it).
REFUSED = {
    errno.EROFS: ("{path} is on a read-only file system", "make {place} writable"),
    errno.EACCES: ("permission denied for {path}", "give this user access to {place}"),
    errno.EPERM: (
        "{path} may not be changed by this user (operation not permitted)",
        "give this user access to {place}",
    ),
}
FULL = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded"}

#: Last parts of configuration keys whose values set how much memory a job needs, most direct first.
MEMORY_KEYS = (
    "batch_size",
    "micro_batch_size",
    "block_size",
    "sequence_length",
    "n_layers",
    "n_embd",
    "width",
    "d_ff",
    "n_heads",
    "head_dim",
    "vocab_size",
    "n_experts",
)


@contextmanager
def one_line_failures(name: str, root: Path, config: Mapping[str, Any], schema: Any = None) -> Iterator[None]:
    """Run the body of job ``name`` (root ``root``, configuration ``config``); disk and memory
    failures leave it as one :class:`ResourceError`."""
    try:
        yield
    except Exception as exc:
        error = resource_error(exc, name, root, config, schema)
        if error is None:
            raise
        raise error from exc


def resource_error(
    exc: BaseException, name: str, root: Path, config: Mapping[str, Any], schema: Any = None
) -> ResourceError | None:
    """The one-line error for ``exc``, or None when it is not a disk or memory failure."""
    if isinstance(exc, OSError) and (exc.errno in REFUSED or exc.errno in FULL):
        return disk_error(exc, root, output_paths(config, schema))
    if out_of_memory(exc):
        return memory_error(exc, name, config, schema)
    return None


def output_paths(config: Mapping[str, Any], schema: Any) -> dict[str, Path]:
    """The configuration's local path values (``hf/out`` ...) by key."""
    if schema is None:
        return {}
    paths = {}
    for spec in schema:
        value = config.get(spec.key)
        if spec.path is not None and isinstance(value, str) and value.startswith("/"):
            paths[spec.key] = Path(value)
    return paths


def disk_error(exc: OSError, root: Path, paths: Mapping[str, Path]) -> ResourceError:
    """A refused or failed write, naming the path (or, when unknown, where the job writes) and the fix."""
    number, path = exc.errno or 0, written_path(exc)
    if path is None:
        places = " or ".join([f"--root {str(root)!r}", *(f"{k} {str(v)!r}" for k, v in paths.items())])
        problem = FULL.get(number) or f"{exc.strerror or 'access refused'}"
        return ResourceError(f"{problem} while writing under {places}; {fix(number, '--root', root)}")
    if number in FULL:
        problem = f"{FULL[number]} while writing {str(path)!r}"
    else:
        problem = REFUSED[number][0].format(path=repr(str(path)))
    return ResourceError(f"{problem}; {fix(number, owning_key(path, root, paths), existing(path))}")


def fix(number: int, owner: str | None, place: Path) -> str:
    """Free space on ``place``'s device or make ``place`` writable, else choose another ``--root`` / key."""
    other = f" or choose another {owner}" if owner else ""
    if number in FULL:
        return f"free disk space on the device holding {str(place)!r}{other}, then run the same command again"
    return REFUSED[number][1].format(place=repr(str(place))) + other


def existing(path: Path) -> Path:
    """``path`` if it exists, else its nearest existing parent folder (one this user may look into)."""
    while not os.path.exists(path) and path.parent != path:
        path = path.parent
    return path


def written_path(exc: OSError) -> Path | None:
    """The path the failed call named, else the file being written where it failed (a full disk is
    often noticed by ``write`` or ``close``, which name no path)."""
    if exc.filename is not None:
        return Path(str(exc.filename))
    frames = []
    tb: TracebackType | None = exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):
        for value in frame.f_locals.values():
            if isinstance(value, io.IOBase) and _writing(value):
                return Path(str(getattr(value, "name", "")))
    return None


def _writing(file: io.IOBase) -> bool:
    name, mode = getattr(file, "name", None), str(getattr(file, "mode", ""))
    return isinstance(name, str) and any(flag in mode for flag in "wax+")


def owning_key(path: Path, root: Path, paths: Mapping[str, Path]) -> str | None:
    """``--root`` when ``path`` lies under the root, else the configuration key whose path holds it, or
    whose staging sibling does (``.<out>.exporting-...`` beside ``hf/out``), else None."""
    if _within(path, root):
        return "--root"
    for key, value in paths.items():
        for part in (path, *path.parents):
            if part == value or (part.parent == value.parent and _staged_name(part.name, value.name)):
                return key
    return None


def _staged_name(name: str, target: str) -> bool:
    """Whether ``name`` is a temporary name for ``target`` (``target.tmp``, ``.target.exporting-x``)."""
    return name.lstrip(".").startswith(target + ".")


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def out_of_memory(exc: BaseException) -> bool:
    """A ``MemoryError``, or an XLA runtime error saying memory ran out."""
    if isinstance(exc, MemoryError):
        return True
    names = {cls.__name__ for cls in type(exc).__mro__}
    text = str(exc)
    return bool(names & {"XlaRuntimeError", "JaxRuntimeError"}) and (
        "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()
    )


def memory_error(exc: BaseException, name: str, config: Mapping[str, Any], schema: Any) -> ResourceError:
    """Out of memory, naming what ran out and the keys to lower."""
    detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if len(detail) > 160:
        detail = detail[:157] + "..."
    keys = memory_keys(config, schema)
    lower = f"lower {' or '.join(keys)}" if keys else "use a smaller configuration"
    return ResourceError(f"out of memory running {name} ({type(exc).__name__}: {detail}); {lower}")


def memory_keys(config: Mapping[str, Any], schema: Any, most: int = 3) -> list[str]:
    """``key=value`` of the size keys raised above their defaults, largest factor first; else the batch
    and block sizes as configured."""
    defaults = schema.defaults() if schema is not None else {}
    sized = [key for key in config if _last(key) in MEMORY_KEYS and _number(config[key])]
    raised = [key for key in sized if key in defaults and config[key] != defaults[key]]
    raised = [key for key in raised if _factor(config[key], defaults[key]) >= 1.0]
    if raised:
        raised.sort(key=lambda key: -_factor(config[key], defaults[key]))
    else:
        raised = [key for key in sized if _last(key) in ("batch_size", "block_size", "sequence_length")]
        raised.sort(key=lambda key: MEMORY_KEYS.index(_last(key)))
    return [f"{key}={config[key]}" for key in raised[:most]]


def _last(key: str) -> str:
    return key.rsplit("/", 1)[-1]


def _number(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _factor(value: int, default: Any) -> float:
    return value / default if _number(default) else 1.0


__all__ = ["MEMORY_KEYS", "memory_keys", "one_line_failures", "out_of_memory", "resource_error", "written_path"]
