"""What the machine refuses a job, as one line: a read-only or forbidden path, a full disk, no memory.

Every ``theseus`` command runs inside this mapping (``TheseusGroup.invoke``), and ``theseus run`` runs
each job inside :func:`one_line_failures`, which knows its configuration. An ``OSError`` with ``EROFS``,
``EACCES``, ``EPERM``, ``ENOSPC`` or ``EDQUOT``, a ``MemoryError`` or an XLA out-of-memory error
that escapes the job becomes a :class:`~theseus.errors.ResourceError` naming the path (or the
settings that need less memory without changing the model) and the fix. Errors the job already
reported as a :class:`~theseus.errors.TheseusError` (a checkpoint save that ran out of space, data
preparation on a full disk) pass through unchanged; anything else keeps its traceback.
"""

from __future__ import annotations

import errno
import io
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, TypeGuard

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

#: The keys that take less memory per step without changing the model: the batch, its rows per pass
#: (micro-batches accumulate to the same batch), recomputation in the backward pass, the row length.
BATCH_KEY = "training/batch_size"
MICRO_KEY = "training/micro_batch_size"
REMAT_KEY = "model/remat"
STATE_DTYPE_KEY = "optimizer/state_dtype"
OFFLOAD_KEY = "optimizer/offload"
SEQUENCE_KEY = "training/sequence_length"
#: The rows per forward pass of the jobs that only run the model (``eval/harness``, ``generate``).
INFERENCE_BATCH_KEYS = ("eval/batch_size", "generate/samples")


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
    """Out of memory, naming what ran out and the settings that need less."""
    detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if len(detail) > 160:
        detail = detail[:157] + "..."
    return ResourceError(f"out of memory running {name} ({type(exc).__name__}: {detail}); {memory_advice(config)}")


def memory_advice(config: Mapping[str, Any]) -> str:
    """What to set for a step that needs less memory (:func:`memory_settings`), as the end of a line."""
    settings = memory_settings(config)
    if not settings:
        return "use a smaller configuration"
    listed = settings[0] if len(settings) == 1 else f"{', '.join(settings[:-1])} or {settings[-1]}"
    return f"use less memory per step with {listed}"


def memory_settings(config: Mapping[str, Any]) -> list[str]:
    """``key=value`` settings of the configuration's keys that lower what a step holds without changing
    the model: the batch, the rows per pass (the same batch in more passes), full remat, the optimizer
    state in bfloat16 or in host memory, the row length; for evaluation and generation, the rows per
    forward pass."""
    settings = []
    batch = config.get(BATCH_KEY)
    if _number(batch) and batch > 1:
        settings.append(f"{BATCH_KEY}={batch // 2}")
    rows = config.get(MICRO_KEY) or batch
    if MICRO_KEY in config and _number(batch) and _number(rows) and rows % 2 == 0 and batch % (rows // 2) == 0:
        settings.append(f"{MICRO_KEY}={rows // 2} (the same batch in {batch // (rows // 2)} passes)")
    if REMAT_KEY in config and config[REMAT_KEY] not in ("full", True):  # auto reads as none until it chose
        settings.append(f"{REMAT_KEY}=full")
    if STATE_DTYPE_KEY in config and config[STATE_DTYPE_KEY] == "float32":
        settings.append(f"{STATE_DTYPE_KEY}=bfloat16")
    if OFFLOAD_KEY in config and not config[OFFLOAD_KEY]:
        settings.append(f"{OFFLOAD_KEY}=true")
    length = config.get(SEQUENCE_KEY) or config.get("architecture/block_size")
    if SEQUENCE_KEY in config and _number(length) and length > 1:
        settings.append(f"{SEQUENCE_KEY}={length // 2}")
    for key in INFERENCE_BATCH_KEYS:
        rows = config.get(key)
        if _number(rows) and rows > 1:
            settings.append(f"{key}={rows // 2}")
    return settings


def optimizer_state_settings(config: Mapping[str, Any]) -> list[str]:
    """How the optimizer state could take less device memory, for the settings not already chosen:
    ``in bfloat16 (optimizer/state_dtype=bfloat16)``, ``in host memory (optimizer/offload=true)``."""
    settings = []
    if config.get(STATE_DTYPE_KEY, "float32") == "float32":
        settings.append(f"in bfloat16 ({STATE_DTYPE_KEY}=bfloat16)")
    if not config.get(OFFLOAD_KEY, False):
        settings.append(f"in host memory ({OFFLOAD_KEY}=true)")
    return settings


def _number(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


__all__ = [
    "memory_advice",
    "memory_settings",
    "one_line_failures",
    "optimizer_state_settings",
    "out_of_memory",
    "resource_error",
    "written_path",
]
