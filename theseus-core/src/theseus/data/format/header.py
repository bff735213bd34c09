"""The prepared-data folder and its ``header.json``: names, paths, the token dtype and the ``Header``."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from theseus.base import jsonfile
from theseus.errors import DataError

FORMAT = "theseus-tokens"
FORMAT_VERSION = 1
HEADER_FILE = "header.json"
INDEX_COLUMNS = 3  # start, length, prompt_length
STYLES = ("pmd", "padded", "packed", "pairs")


def check_name(name: str) -> str:
    """``name`` if it can name a prepared-data folder, else a DataError."""
    if not isinstance(name, str) or not name or "/" in name or "\\" in name or name.startswith("."):
        raise DataError(f"dataset name {name!r} cannot name a folder; use a plain name such as 'my-corpus'")
    return name


def data_folder(root: str | Path, name: str) -> Path:
    """``<root>/data/<name>``: where the dataset ``name`` is prepared."""
    return Path(root).expanduser() / "data" / check_name(name)


def token_dtype(vocab_size: int) -> np.dtype[Any]:
    """``uint16`` when every id fits, else ``uint32``."""
    if vocab_size <= 0:
        raise DataError(f"vocabulary size must be positive, got {vocab_size}")
    if vocab_size <= 2**16:
        return np.dtype(np.uint16)
    if vocab_size <= 2**32:
        return np.dtype(np.uint32)
    raise DataError(f"vocabulary size {vocab_size} does not fit in uint32 token shards")


def prepare_command(name: str, root: str | Path, dataset: str | None = None) -> str:
    """The exact command that prepares dataset ``name`` under ``root``."""
    parts = ["theseus", "run", "data/tokenize", f"data/dataset={dataset or name}"]
    if dataset is not None and dataset != name:
        parts.append(f"data/name={name}")
    parts += ["--root", str(Path(root).expanduser())]
    return " ".join(shlex.quote(p) for p in parts)


@dataclass(frozen=True)
class SplitInfo:
    """Token and document counts of one split."""

    tokens: int
    documents: int


@dataclass(frozen=True)
class Header:
    """The contents of ``header.json``."""

    name: str
    tokenizer: dict[str, Any]
    vocab_size: int
    eot_id: int
    dtype: str
    splits: dict[str, SplitInfo]
    source: dict[str, Any] = field(default_factory=dict)
    style: str = "pmd"
    masked: bool = False
    version: int = FORMAT_VERSION
    created: str = ""

    @property
    def total_tokens(self) -> int:
        return sum(s.tokens for s in self.splits.values())

    def identity(self) -> dict[str, Any]:
        """What tells these prepared contents apart: a digest of the header without its time of
        creation (the same data prepared again the same way keeps it), the split sizes, and that time."""
        import hashlib

        described = {k: v for k, v in self.to_json().items() if k != "created"}
        digest = hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode()).hexdigest()
        splits = {k: {"tokens": v.tokens, "documents": v.documents} for k, v in self.splits.items()}
        return {"digest": digest[:16], "splits": splits, "created": self.created}

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": self.version,
            "name": self.name,
            "style": self.style,
            "masked": self.masked,
            "tokenizer": dict(self.tokenizer),
            "vocab_size": self.vocab_size,
            "eot_id": self.eot_id,
            "dtype": self.dtype,
            "splits": {k: {"tokens": v.tokens, "documents": v.documents} for k, v in self.splits.items()},
            "source": dict(self.source),
            "created": self.created,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str) -> Header:
        fix = "re-prepare it with data/force=true"
        if data.get("format") != FORMAT:
            raise DataError(f"{where} is not a theseus token header (format {data.get('format')!r}); {fix}")
        version = data.get("version")
        if version != FORMAT_VERSION:
            raise DataError(
                f"{where} has format version {version!r}, this theseus reads version {FORMAT_VERSION}; {fix}"
            )
        try:
            splits = {
                str(k): SplitInfo(tokens=int(v["tokens"]), documents=int(v["documents"]))
                for k, v in dict(data["splits"]).items()
            }
            header = cls(
                name=str(data["name"]),
                tokenizer=dict(data["tokenizer"]),
                vocab_size=int(data["vocab_size"]),
                eot_id=int(data["eot_id"]),
                dtype=str(data["dtype"]),
                splits=splits,
                source=dict(data.get("source") or {}),
                style=str(data.get("style", "pmd")),
                masked=bool(data.get("masked", False)),
                version=int(version),
                created=str(data.get("created", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(f"{where} is missing or has a malformed entry ({exc}); {fix}") from exc
        if header.dtype not in ("uint16", "uint32") or np.dtype(header.dtype) != token_dtype(header.vocab_size):
            raise DataError(
                f"{where} says dtype {header.dtype} for vocabulary {header.vocab_size}, expected "
                f"{token_dtype(header.vocab_size).name}; {fix}"
            )
        if not 0 <= header.eot_id < header.vocab_size:
            raise DataError(f"{where} has end-of-text id {header.eot_id} outside vocabulary {header.vocab_size}; {fix}")
        return header


def read_header(folder: str | Path) -> Header:
    """Read ``<folder>/header.json`` (DataError when missing or malformed)."""
    path = Path(folder) / HEADER_FILE
    try:
        data = jsonfile.read_object(path)
    except jsonfile.UnreadableJSON as exc:
        if exc.missing:
            raise DataError(f"{path} does not exist: the data is not prepared") from None
        raise DataError(f"{path} is unreadable ({exc.reason}); re-prepare the data with data/force=true") from None
    return Header.from_json(data, str(path))


__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "HEADER_FILE",
    "INDEX_COLUMNS",
    "STYLES",
    "Header",
    "SplitInfo",
    "check_name",
    "data_folder",
    "prepare_command",
    "read_header",
    "token_dtype",
]
