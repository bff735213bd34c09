"""Checksums of a saved state: recorded when a save is finalised, verified before the state is read.

The manifest (``checksums.json`` in the state folder) lists every file orbax wrote there, with its
size and CRC-32. It is written on process 0 after orbax has merged the processes' files and before
the save is committed (the folder is renamed into place afterwards), so a committed checkpoint of
this format always carries it. No orbax import: listing runs reads this module.
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path

#: The manifest's name inside a state folder.
MANIFEST = "checksums.json"
ALGORITHM = "crc32"
#: The key a checkpoint's meta JSON carries when its state has a manifest.
META_KEY = "checksums"
_CHUNK = 16 << 20


def file_checksum(path: Path) -> str:
    """The CRC-32 of a file's bytes, as 8 hex digits (read in 16 MiB pieces)."""
    crc = 0
    with open(path, "rb", buffering=0) as handle:
        while piece := handle.read(_CHUNK):
            crc = zlib.crc32(piece, crc)
    return f"{crc:08x}"


def _files(folder: Path) -> list[Path]:
    found: list[Path] = []
    for directory, _subdirs, names in os.walk(folder):
        found.extend(Path(directory) / name for name in names if name != MANIFEST)
    return sorted(found)


def write_manifest(folder: str | Path) -> None:
    """Record the size and checksum of every file under ``folder`` in its manifest (written atomically)."""
    folder = Path(folder)
    files = {path.relative_to(folder).as_posix(): [path.stat().st_size, file_checksum(path)] for path in _files(folder)}
    partial = folder / f".{MANIFEST}.partial"
    partial.write_text(json.dumps({"algorithm": ALGORITHM, "files": files}, separators=(",", ":")))
    partial.replace(folder / MANIFEST)


#: Where orbax's JSON handler keeps a step's ``meta`` item, relative to the step folder.
META_FILE = Path("meta") / "metadata"


def has_manifest(folder: str | Path) -> bool:
    return (Path(folder) / MANIFEST).is_file()


def declares_checksums(step_dir: str | Path) -> bool:
    """Whether a step's meta says its state was saved with a manifest (unreadable meta: yes, so that a
    damaged step is not mistaken for one saved before manifests existed)."""
    try:
        meta = json.loads((Path(step_dir) / META_FILE).read_text())
    except FileNotFoundError:
        return False
    except (OSError, ValueError):
        return True
    return not isinstance(meta, dict) or META_KEY in meta


def damage(folder: str | Path) -> str | None:
    """What is wrong with the files of the state ``folder`` (``<step>/state``) against its manifest; None
    when all match, or when the step predates manifests and has none."""
    folder = Path(folder)
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return "its checksum manifest is missing" if declares_checksums(folder.parent) else None
    try:
        recorded = json.loads(manifest.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"its checksum manifest is unreadable ({type(exc).__name__})"
    for name, (size, checksum) in sorted(recorded.items()):
        path = folder / name
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


__all__ = [
    "ALGORITHM",
    "MANIFEST",
    "META_FILE",
    "META_KEY",
    "damage",
    "declares_checksums",
    "file_checksum",
    "has_manifest",
    "write_manifest",
]
