"""Rows from Hugging Face ``datasets``: hub streaming and local files share one code path."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from theseus.errors import DataError

SUFFIXES = {"parquet": (".parquet",), "json": (".jsonl", ".json"), "text": (".txt",)}


def find_files(path: str | Path, suffixes: Sequence[str], *, key: str) -> list[str]:
    """``path`` itself, or every file under the folder ``path`` ending in ``suffixes`` (sorted)."""
    p = Path(path).expanduser()
    if p.is_file():
        return [str(p)]
    if not p.exists():
        raise DataError(f"{key}={path} does not exist; point it at a file or a folder of {'/'.join(suffixes)} files")
    files = sorted(str(f) for f in p.rglob("*") if f.is_file() and f.name.endswith(tuple(suffixes)))
    if not files:
        raise DataError(f"{key}={path} holds no {'/'.join(suffixes)} files; point it at the downloaded files")
    return files


def stream_rows(
    builder: str,
    *,
    data_files: list[str] | None = None,
    config_name: str | None = None,
    split: str = "train",
    columns: Sequence[str] = (),
    hint: str = "",
) -> Iterator[dict[str, Any]]:
    """Stream rows with ``datasets.load_dataset(builder, ..., streaming=True)``.

    ``builder`` is a hub repository (``"HuggingFaceFW/fineweb"`` with ``config_name``) or a packaged
    builder (``"parquet"``, ``"json"``) with ``data_files``. Loading failures become one DataError line.
    """
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - declared dependency
        raise DataError("the 'datasets' package is missing; pip install theseus-data") from exc
    where = f"{builder}" + (f" ({config_name})" if config_name else "")
    try:
        kwargs: dict[str, Any] = {"split": split, "streaming": True}
        if data_files is not None:
            kwargs["data_files"] = data_files
        if config_name:
            kwargs["name"] = config_name
        stream = datasets.load_dataset(builder, **kwargs)
        iterator = iter(stream)
        first = next(iterator, None)
    except DataError:
        raise
    except Exception as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(f"could not read {where}: {type(exc).__name__}: {message}{hint}") from exc
    if first is None:
        return
    missing = [c for c in columns if c not in first]
    if missing:
        raise DataError(
            f"{where} rows have no column {missing[0]!r} (columns: {', '.join(first)}); "
            "point the dataset at files with that column"
        )
    yield first
    try:
        yield from iterator
    except Exception as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(f"reading {where} failed: {type(exc).__name__}: {message}{hint}") from exc
