"""Checksums of a saved state: recorded when a save is finalised, verified before the state is read.

Each process records the size and CRC-32 of the files it wrote (orbax's per-process folders
``ocdbt.process_<i>/`` and ``array_metadatas/process_<i>``) in its part manifest
``checksums.process_<i>.json``, once its writes are done and before the processes meet at orbax's
commit barrier. Process 0 then finalises the save: it records the remaining files (those orbax's merge
writes, and the part manifests themselves) in ``checksums.json`` with the list of parts. That
manifest is written before the save is committed (the folder is renamed into place afterwards), so
a committed checkpoint of this format always carries it; checkpoints saved before part manifests
existed list every file in ``checksums.json``.

Verification reads the manifests, splits the recorded files among the processes that restore
(balanced by bytes, the same split on every process: :func:`shares`), and each process checks its
share (:func:`verify_share`); :mod:`theseus.checkpoint.agreement` makes their verdicts one. The
verdict names the first damaged file in name order, whatever the number of processes.
No orbax or jax import: listing runs reads this module.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from theseus.base import jsonfile
from theseus.files import replace_file

#: The manifest's name inside a state folder.
MANIFEST = "checksums.json"
#: The part manifest of process ``i`` is ``checksums.process_<i>.json``.
PART_PREFIX = "checksums.process_"
ALGORITHM = "crc32"
#: The key a checkpoint's meta JSON carries when its state has a manifest.
META_KEY = "checksums"
_CHUNK = 16 << 20

#: ``name -> (size, checksum)`` of the files a manifest records.
Recorded = dict[str, tuple[int, str]]


def file_checksum(path: Path) -> str:
    """The CRC-32 of a file's bytes, as 8 hex digits (read in 16 MiB pieces)."""
    crc = 0
    with open(path, "rb", buffering=0) as handle:
        while piece := handle.read(_CHUNK):
            crc = zlib.crc32(piece, crc)
    return f"{crc:08x}"


def part_name(process: int) -> str:
    """The file name of process ``process``'s part manifest."""
    return f"{PART_PREFIX}{process}.json"


def _is_manifest(name: str) -> bool:
    return name == MANIFEST or name.startswith((PART_PREFIX, f".{MANIFEST}", f".{PART_PREFIX}"))


def _files(folder: Path, *, parts: bool = False) -> list[Path]:
    """The files under ``folder`` but the manifests (with ``parts``: the part manifests count as files)."""
    found: list[Path] = []
    for directory, _subdirs, names in os.walk(folder):
        for name in names:
            top = directory == str(folder)
            if top and _is_manifest(name) and not (parts and name.startswith(PART_PREFIX) and name.endswith(".json")):
                continue
            found.append(Path(directory) / name)
    return sorted(found)


def owned_by(relative: str, process: int) -> bool:
    """Whether ``relative`` (a path under the state folder) lies in orbax's files of ``process``: its
    ``ocdbt.process_<i>`` folder or its ``process_<i>`` array metadata."""
    return any(part in (f"ocdbt.process_{process}", f"process_{process}") for part in relative.split("/"))


def _record(folder: Path, paths: list[Path]) -> dict[str, list[int | str]]:
    return {path.relative_to(folder).as_posix(): [path.stat().st_size, file_checksum(path)] for path in paths}


def _write_json(path: Path, record: Mapping[str, object]) -> None:
    replace_file(path, json.dumps(record, separators=(",", ":")))


def write_part(folder: str | Path, process: int) -> Path:
    """Record the size and checksum of the files ``process`` wrote under ``folder`` in its part manifest
    (written atomically); the manifest's path."""
    folder = Path(folder)
    files = [path for path in _files(folder) if owned_by(path.relative_to(folder).as_posix(), process)]
    target = folder / part_name(process)
    _write_json(target, {"algorithm": ALGORITHM, "process": process, "files": _record(folder, files)})
    return target


def write_manifest(folder: str | Path) -> None:
    """Finalise the manifest of ``folder``: record every file no part manifest records (the part
    manifests included) in ``checksums.json``, with the names of the parts (written atomically).
    Without part manifests it records every file."""
    folder = Path(folder)
    parts = sorted(path.name for path in folder.glob(f"{PART_PREFIX}*.json"))
    covered: set[str] = set()
    for name in parts:
        covered.update(jsonfile.read_object(folder / name)["files"])
    files = [path for path in _files(folder, parts=True) if path.relative_to(folder).as_posix() not in covered]
    record: dict[str, object] = {"algorithm": ALGORITHM, "files": _record(folder, files)}
    if parts:
        record["parts"] = parts
    _write_json(folder / MANIFEST, record)


#: Where orbax's JSON handler keeps a step's ``meta`` item, relative to the step folder.
META_FILE = Path("meta") / "metadata"


def has_manifest(folder: str | Path) -> bool:
    return (Path(folder) / MANIFEST).is_file()


def declares_checksums(step_dir: str | Path) -> bool:
    """Whether a step's meta says its state was saved with a manifest (unreadable meta: yes, so that a
    damaged step is not mistaken for one saved before manifests existed)."""
    try:
        meta = jsonfile.read(Path(step_dir) / META_FILE, check_numbers=False)  # only a key is looked up
    except jsonfile.UnreadableJSON as exc:
        return not exc.missing
    return not isinstance(meta, dict) or META_KEY in meta


class ManifestProblem(Exception):
    """The manifests of a state cannot be read, or do not match their own checksums (the message says why)."""


def _recordable(name: str) -> bool:
    """Whether ``name`` is a path a manifest may record: relative to the state folder, in ``/`` parts none
    of which is empty, ``.`` or ``..``."""
    return bool(name) and "\x00" not in name and all(part not in ("", ".", "..") for part in name.split("/"))


def _check_names(names: list[str], what: str) -> None:
    """ManifestProblem for the first of ``names`` that points outside the state folder (before any is read)."""
    for name in names:
        if not _recordable(name):
            shown = ascii(name) if len(name) <= 80 else ascii(name[:77]) + "..."
            raise ManifestProblem(f"its checksum manifest {what} names {shown}, a path outside the checkpoint")


def _file_problem(folder: Path, name: str, size: int, checksum: str) -> str | None:
    """What is wrong with file ``name`` against its recorded size and checksum; None when it matches.
    A file reached through a symbolic link that leads out of ``folder`` is not read."""
    path = folder / name
    if not os.path.realpath(path).startswith(os.path.join(os.path.realpath(folder), "")):
        return f"{name} is a link to a file outside the checkpoint"
    try:
        actual_size = path.stat().st_size
        if actual_size != size:
            return f"{name} holds {actual_size} bytes where {size} were saved"
        if file_checksum(path) != checksum:
            return f"{name} does not match its checksum"
    except FileNotFoundError:
        return f"{name} is missing"
    except OSError as exc:
        return f"{name} cannot be read ({exc.strerror or type(exc).__name__})"
    return None


def _entries(record: object) -> Recorded:
    files = record["files"]  # type: ignore[index]
    return {str(name): (int(size), str(checksum)) for name, (size, checksum) in files.items()}


def read_manifest(folder: str | Path) -> Recorded | None:
    """Every file the manifests of the state ``folder`` record, merged (but the part manifests, which it
    checks against the checksums ``checksums.json`` records for them); None when the step predates
    manifests and has none. Raises ``ManifestProblem`` when a manifest is missing, unreadable or damaged."""
    folder = Path(folder)
    if not (folder / MANIFEST).is_file():
        if declares_checksums(folder.parent):
            raise ManifestProblem("its checksum manifest is missing")
        return None
    try:
        record = jsonfile.read(folder / MANIFEST)
        files = _entries(record)
        parts = [str(name) for name in record.get("parts", [])]
    except jsonfile.UnreadableJSON as exc:
        raise ManifestProblem(f"its checksum manifest is unreadable ({exc.reason})") from None
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise ManifestProblem(f"its checksum manifest is unreadable ({type(exc).__name__})") from None
    _check_names([*files, *parts], MANIFEST)
    for name in parts:
        if "/" in name or not name.startswith(PART_PREFIX):
            raise ManifestProblem(f"its checksum manifest names {name[:80]!a} as a part, which is no part manifest")
    merged = {name: entry for name, entry in files.items() if name not in parts}
    for name in parts:
        if name in files:
            problem = _file_problem(folder, name, *files[name])
            if problem is not None:
                raise ManifestProblem(problem)
        try:
            entries = _entries(jsonfile.read(folder / name))
        except jsonfile.UnreadableJSON as exc:
            if exc.missing:
                raise ManifestProblem(f"its checksum manifest {name} is missing") from None
            raise ManifestProblem(f"its checksum manifest {name} is unreadable ({exc.reason})") from None
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise ManifestProblem(f"its checksum manifest {name} is unreadable ({type(exc).__name__})") from None
        _check_names(list(entries), name)
        merged.update(entries)
    return merged


def shares(files: Mapping[str, tuple[int, str]], count: int) -> list[list[str]]:
    """Split the recorded ``files`` among ``count`` processes, balanced by bytes: the largest file first,
    each to the process with the fewest bytes so far (the lowest index on a tie). Every process computes
    the same split; each share is in name order."""
    loads = [0] * count
    split: list[list[str]] = [[] for _ in range(count)]
    for name in sorted(files, key=lambda name: (-files[name][0], name)):
        process = min(range(count), key=lambda index: (loads[index], index))
        split[process].append(name)
        loads[process] += files[name][0]
    return [sorted(share) for share in split]


@dataclass(frozen=True)
class Verification:
    """The verdict of one process on its share of a state's files.

    ``problem`` says what is wrong (None: its share matches); ``rank`` orders problems as one process
    checking every file would find them first (-1: the manifests themselves, else the damaged file's
    position in name order). ``files`` and ``bytes_read`` count what this process checked.
    """

    problem: str | None
    rank: int = -1
    files: int = 0
    bytes_read: int = 0


def verify_share(folder: str | Path, process: int = 0, count: int = 1) -> Verification:
    """Check process ``process``'s share (of ``count``) of the files the manifests of the state ``folder``
    record, in name order, stopping at the first damaged one. The whole state with the defaults; a step
    that predates manifests and has none passes."""
    folder = Path(folder)
    try:
        files = read_manifest(folder)
    except ManifestProblem as exc:
        return Verification(str(exc))
    if files is None:
        return Verification(None)
    order = {name: index for index, name in enumerate(sorted(files))}
    checked = read = 0
    for name in shares(files, count)[process]:
        size, checksum = files[name]
        problem = _file_problem(folder, name, size, checksum)
        checked += 1
        read += size if problem is None or problem.endswith("does not match its checksum") else 0
        if problem is not None:
            return Verification(problem, order[name], checked, read)
    return Verification(None, len(files), checked, read)


def damage(folder: str | Path) -> str | None:
    """What is wrong with the files of the state ``folder`` (``<step>/state``) against its manifests; None
    when all match, or when the step predates manifests and has none. Reads every file (one process)."""
    return verify_share(folder).problem


__all__ = [
    "ALGORITHM",
    "MANIFEST",
    "META_FILE",
    "META_KEY",
    "PART_PREFIX",
    "ManifestProblem",
    "Verification",
    "damage",
    "declares_checksums",
    "file_checksum",
    "has_manifest",
    "owned_by",
    "part_name",
    "read_manifest",
    "shares",
    "verify_share",
    "write_manifest",
    "write_part",
]
