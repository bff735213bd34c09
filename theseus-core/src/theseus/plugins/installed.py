"""The installed distributions that register theseus entry points, read from two small files each.

``importlib.metadata`` parses a distribution's whole ``METADATA`` file with the ``email`` package
every time its name or version is asked for, and importing it costs a listing as much again.
Listing needs only the distributions that declare ``theseus.*`` entry points, and of those only
``Name``, ``Version`` and ``Requires-Dist``: this module finds the ``*.dist-info`` folders on
``sys.path`` as ``importlib.metadata`` does, reads ``entry_points.txt`` of each (a plain file
read) and the header block of ``METADATA`` of the few that register something. Where the path
holds what only ``importlib.metadata`` can read (a zip file, an egg, a distribution finder of
its own), it asks ``importlib.metadata``.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib.machinery import PathFinder
from typing import Protocol

JOBS_GROUP = "theseus.jobs"
COMPONENTS_GROUP = "theseus.components"
GROUPS = (JOBS_GROUP, COMPONENTS_GROUP)


@dataclass(frozen=True)
class Provider:
    """A distribution that registers theseus entry points."""

    name: str  #: as its metadata spells it (``theseus-fixture-good``)
    version: str
    requires: tuple[str, ...]  #: its ``Requires-Dist`` lines
    entry_points: tuple[tuple[str, str, str], ...]  #: ``(group, name, value)`` in file order


def canonical(name: str) -> str:
    """The normalised form of a distribution name (PEP 503): ``Theseus_Core`` -> ``theseus-core``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_entry_points(text: str, groups: Iterable[str] = GROUPS) -> list[tuple[str, str, str]]:
    """``(group, name, value)`` of the entry points in ``groups`` of an ``entry_points.txt``."""
    wanted = set(groups)
    found: list[tuple[str, str, str]] = []
    group = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            group = line[1:-1].strip()
            continue
        name, sep, value = line.partition("=")
        if sep and group in wanted:
            found.append((group, name.strip(), value.strip()))
    return found


def header_fields(text: str) -> dict[str, list[str]]:
    """The header block of a ``METADATA`` / ``PKG-INFO`` file, by lower-cased field name.

    The header ends at the first empty line (the long description follows); folded continuation
    lines occur only in fields this module does not read, and are skipped.
    """
    fields: dict[str, list[str]] = {}
    for line in text.splitlines():
        if not line.strip():
            break
        if line[0] in " \t":
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip().lower(), []).append(value.strip())
    return fields


class _Source(Protocol):
    """What is read of an installed distribution (``importlib.metadata.Distribution`` is one)."""

    def read_text(self, filename: str) -> str | None: ...

    @property
    def requires(self) -> list[str] | None: ...


class _Folder:
    """A ``*.dist-info`` / ``*.egg-info`` folder, read without ``importlib.metadata``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def read_text(self, filename: str) -> str | None:
        try:
            with open(os.path.join(self.path, filename), encoding="utf-8") as file:
                return file.read()
        except (OSError, ValueError):
            return None

    @property
    def requires(self) -> list[str] | None:
        """Requirements of an egg-info folder (``requires.txt``), which only importlib.metadata reads."""
        from importlib import metadata
        from pathlib import Path

        return metadata.PathDistribution(Path(self.path)).requires


def _folders() -> list[tuple[str, _Folder]] | None:
    """``(normalised name, folder)`` of every distribution on ``sys.path``, in the order
    ``importlib.metadata`` finds them; None where it would find more than folders show."""
    if any(
        getattr(finder, "find_distributions", None) is not None for finder in sys.meta_path if finder is not PathFinder
    ):
        return None
    found: list[tuple[str, _Folder]] = []
    for entry in sys.path:
        root = entry or "."
        if root.lower().endswith(".egg") or os.path.isfile(root):
            return None
        try:
            children = os.listdir(root)
        except OSError:
            continue
        by_name: dict[str, list[str]] = {}
        for child in children:
            low = child.lower()
            if low.endswith((".dist-info", ".egg-info")):
                by_name.setdefault(canonical(low.rpartition(".")[0].partition("-")[0]), []).append(child)
        found += [(name, _Folder(os.path.join(root, child))) for name, kids in by_name.items() for child in kids]
    return found


def _sources() -> Iterator[tuple[str | None, _Source]]:
    """``(normalised name or None, distribution)`` of everything installed, first on the path first."""
    folders = _folders()
    if folders is not None:
        yield from folders
        return
    from importlib import metadata

    for dist in metadata.distributions():
        yield None, dist


def _provider(dist: _Source, entries: list[tuple[str, str, str]]) -> Provider:
    text = dist.read_text("METADATA")
    if text is not None:
        fields = header_fields(text)
        requires = tuple(fields.get("requires-dist", ()))
    else:  # an egg-info folder: PKG-INFO and requires.txt
        fields = header_fields(dist.read_text("PKG-INFO") or "")
        requires = tuple(dist.requires or ())
    name = (fields.get("name") or ["?"])[0]
    version = (fields.get("version") or [""])[0]
    return Provider(name, version, requires, tuple(entries))


def providers(groups: Iterable[str] = GROUPS) -> list[Provider]:
    """Every installed distribution with entry points in ``groups``, first on ``sys.path`` first.

    A later distribution of the same name (an older copy further down the path) is left out, as
    ``importlib.metadata.entry_points`` leaves it out.
    """
    groups = tuple(groups)
    found: list[Provider] = []
    seen: set[str] = set()
    for key, dist in _sources():
        if key is not None:
            if key in seen:
                continue
            seen.add(key)
        text = dist.read_text("entry_points.txt")
        if not text or not any(f"[{group}]" in text for group in groups):
            continue
        entries = parse_entry_points(text, groups)
        if not entries:
            continue
        provider = _provider(dist, entries)
        if key is None:
            if canonical(provider.name) in seen:
                continue
            seen.add(canonical(provider.name))
        found.append(provider)
    return found


__all__ = [
    "COMPONENTS_GROUP",
    "GROUPS",
    "JOBS_GROUP",
    "Provider",
    "canonical",
    "header_fields",
    "parse_entry_points",
    "providers",
]
