"""Local files: plain text (one document per file), JSON lines (one per line) and parquet (one per row)."""

from __future__ import annotations

import codecs
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from theseus.base import jsonfile
from theseus.config import field
from theseus.data.datasets.base import TRAIN, VAL, Dataset, Document
from theseus.data.datasets.hf import find_files, stream_rows
from theseus.data.json_lines import json_lines
from theseus.errors import DataError

FORMATS = {"text": (".txt", ".md", ".py"), "jsonl": (".jsonl", ".json"), "parquet": (".parquet",)}


def detect_format(path: str, key: str) -> str:
    """The format of a file or folder from its file suffixes."""
    p = Path(path).expanduser()
    if not p.exists():
        raise DataError(f"{key}={path} does not exist; point it at a file or folder of text/JSONL/parquet files")
    names = [p.name] if p.is_file() else [f.name for f in p.rglob("*") if f.is_file()]
    for fmt, suffixes in (("parquet", FORMATS["parquet"]), ("jsonl", FORMATS["jsonl"]), ("text", FORMATS["text"])):
        if any(n.endswith(suffixes) for n in names):
            return fmt
    raise DataError(
        f"{key}={path} holds no .txt/.md/.py, .jsonl or .parquet files; "
        "set data/local/format if they use another suffix"
    )


#: The suffixes of JSON-lines files in a folder.
JSONL_SUFFIXES = (".jsonl", ".json")
#: The text that opens a row's split mark, searched for before a line is parsed.
SPLIT_FIELD = b'"split"'


def rows_name_splits(path: str, key: str) -> bool:
    """Whether a row of the JSON-lines file, or of the folder of them, ``path`` names its split
    (``"split": "train"`` or ``"val"``). Only lines holding ``"split"`` are parsed, and the search stops
    at the first mark; a line that is no JSON is left to the reading that reports it."""
    if not path:
        return False
    for file in find_files(path, JSONL_SUFFIXES, key=key):
        with open(file, "rb") as f:
            for raw in f:
                if SPLIT_FIELD in raw and _marks_split(raw):
                    return True
    return False


def _marks_split(raw: bytes) -> bool:
    try:
        row = jsonfile.parse(raw.removeprefix(codecs.BOM_UTF8), check_numbers=False)
    except jsonfile.UnreadableJSON:
        return False
    return isinstance(row, dict) and row.get("split") in (TRAIN, VAL)


def read_jsonl(path: str, field_names: tuple[str, ...], key: str) -> Iterator[dict[str, Any]]:
    """The JSON objects of a JSON-lines file, checking that each has ``field_names``."""
    for where, row in json_lines(path, f"fix the line or the {key}"):
        if not isinstance(row, dict) or any(not isinstance(row.get(n), str) for n in field_names):
            want = ", ".join(repr(n) for n in field_names)
            raise DataError(f"{where} needs string field(s) {want}; fix the file or set the field names")
        yield row


@dataclass
class LocalText(Dataset):
    """Documents from local files or folders of them.

    ``data/local/format``: ``text`` (each file is one document), ``jsonl`` (each line an object whose
    ``data/local/text_field`` holds the document), ``parquet`` (each row, same field), or ``auto``.
    Prepare several local corpora side by side with ``data/name=...``.
    """

    name: ClassVar[str] = "local"

    path: str = field(
        "data/local/path", default="", path="file", help="a file or folder of text, JSONL or parquet files"
    )
    format: str = field("data/local/format", default="auto", help="auto, text, jsonl or parquet")
    text_field: str = field("data/local/text_field", default="text", help="JSONL/parquet field holding the text")

    def resolved_format(self) -> str:
        if not self.path:
            raise DataError("dataset 'local' needs a path; pass data/local/path=FILE_OR_FOLDER")
        if self.format == "auto":
            return detect_format(self.path, "data/local/path")
        if self.format not in FORMATS:
            raise DataError(f"data/local/format={self.format!r} is not one of auto, {', '.join(FORMATS)}")
        return self.format

    def source(self) -> Iterator[Document]:
        fmt = self.resolved_format()
        files = find_files(self.path, FORMATS[fmt], key="data/local/path")
        if fmt == "text":
            for file in files:
                yield Document(Path(file).read_bytes().decode("utf-8", errors="replace"))
        elif fmt == "jsonl":
            for file in files:
                for row in read_jsonl(file, (self.text_field,), "data/local/text_field"):
                    yield Document(row[self.text_field])
        else:
            for row in stream_rows("parquet", data_files=files, columns=(self.text_field,)):
                text = row.get(self.text_field)
                if isinstance(text, str):
                    yield Document(text)

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info["origin"] = str(Path(self.path).expanduser().resolve()) if self.path else ""
        return info
