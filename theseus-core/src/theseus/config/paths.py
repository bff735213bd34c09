"""Paths a user gives on the command line, made absolute once, at the edge.

A job sees only absolute paths: a value relative to the working directory would change meaning
when a library below changes directory or insists on absolute paths (orbax does).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from theseus.config.schema import Schema

if TYPE_CHECKING:
    from theseus.config.configuration import Configuration

#: The ``kind:`` prefix of a ``"spec"`` value whose target is a local folder or a hub id.
SOURCE_PREFIX = "hf:"


def absolute(path: str | Path, cwd: Path | None = None) -> Path:
    """``path`` with ``~`` expanded, joined to ``cwd`` (default: the working directory), ``..`` folded."""
    expanded = Path(path).expanduser()
    return Path(os.path.normpath(Path(cwd or Path.cwd()) / expanded))


def looks_local(value: str, cwd: Path) -> bool:
    """Whether a source names a local path rather than a hub id: it exists, or it reads as a path."""
    return value.startswith(("/", "~", "./", "../")) or value in (".", "..") or (cwd / value).exists()


def absolute_value(value: Any, kind: str, cwd: Path) -> Any:
    """``value`` of a field declared with ``path=kind`` (see ``theseus.config.fields.PATH_KINDS``)."""
    if not isinstance(value, str) or not value:
        return value
    if kind == "file":
        return str(absolute(value, cwd))
    if kind == "source":
        return str(absolute(value, cwd)) if looks_local(value, cwd) else value
    if value.startswith(SOURCE_PREFIX):
        target = value[len(SOURCE_PREFIX) :]
        return SOURCE_PREFIX + absolute_value(target, "source", cwd)
    return value


def absolute_paths(values: Mapping[str, Any], schema: Schema, cwd: Path | None = None) -> dict[str, Any]:
    """``values`` with every key the schema declares as a path made absolute against ``cwd``."""
    base = Path(cwd or Path.cwd())
    resolved = dict(values)
    for spec in schema:
        if spec.path is not None and spec.key in resolved:
            resolved[spec.key] = absolute_value(resolved[spec.key], spec.path, base)
    return resolved


def resolve_absolute(
    schema: Schema, file_values: Mapping[str, Any] | None = None, overrides: Mapping[str, Any] | None = None
) -> Configuration:
    """``resolve`` with every path key made absolute: the configuration a job runs with."""
    from theseus.config.configuration import Configuration, resolve

    return Configuration(absolute_paths(resolve(schema, file_values, overrides), schema), schema)


__all__ = ["absolute", "absolute_paths", "absolute_value", "resolve_absolute"]
