"""Reading prepared data: ``Prepared`` memory-maps a complete folder's shards, checked against its header."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from theseus.data.format.header import (
    HEADER_FILE,
    INDEX_COLUMNS,
    Header,
    SplitInfo,
    data_folder,
    prepare_command,
    read_header,
)
from theseus.errors import DataError


class Prepared:
    """A complete prepared dataset: its header and memory-mapped shards."""

    def __init__(self, folder: str | Path, header: Header | None = None) -> None:
        self.folder = Path(folder)
        self.header = header if header is not None else read_header(self.folder)
        self._tokens: dict[str, np.ndarray] = {}
        self._index: dict[str, np.ndarray] = {}
        self._learned: dict[str, np.ndarray] = {}

    @classmethod
    def open(cls, root: str | Path, name: str, *, dataset: str | None = None) -> Prepared:
        """Open ``<root>/data/<name>``; a missing folder is a DataError naming the command that prepares it."""
        folder = data_folder(root, name)
        if not (folder / HEADER_FILE).is_file():
            state = "is incomplete (no header.json)" if folder.exists() else "is not prepared"
            raise DataError(
                f"dataset {name!r} {state} in {folder}; prepare it with: {prepare_command(name, root, dataset)}"
            )
        return cls(folder)

    @property
    def name(self) -> str:
        return self.header.name

    @property
    def splits(self) -> list[str]:
        return list(self.header.splits)

    @property
    def tokenizer_spec(self) -> dict[str, Any]:
        """The header's tokenizer spec with a relative file path resolved inside this folder."""
        spec = dict(self.header.tokenizer)
        path = spec.get("path")
        if isinstance(path, str) and not Path(path).is_absolute():
            spec["path"] = str(self.folder / path)
        return spec

    def tokenizer(self) -> Any:
        """Load the tokenizer that produced this data, checking it against the header."""
        from theseus.data.tokenizers.spec import load_tokenizer

        tok = load_tokenizer(self.tokenizer_spec)
        if tok.vocab_size != self.header.vocab_size or tok.eot_id != self.header.eot_id:
            raise DataError(
                f"tokenizer {self.header.tokenizer} now has vocabulary {tok.vocab_size} / end-of-text "
                f"{tok.eot_id}, but {self.folder / HEADER_FILE} says {self.header.vocab_size} / "
                f"{self.header.eot_id}; re-prepare {self.name!r} with data/force=true"
            )
        return tok

    def _split_info(self, split: str) -> SplitInfo:
        info = self.header.splits.get(split)
        if info is None:
            have = ", ".join(self.header.splits) or "none"
            raise DataError(
                f"dataset {self.name!r} has no {split!r} split (it has: {have}); re-prepare it with "
                "data/force=true and a data/val_fraction above 0 (a file whose rows name their split: mark some "
                '"split": "val")'
            )
        return info

    def _check_size(self, path: Path, expected: int, what: str) -> None:
        try:
            actual = path.stat().st_size
        except FileNotFoundError as exc:
            raise DataError(
                f"{path} is missing though {self.folder / HEADER_FILE} lists it; re-prepare {self.name!r} "
                "with data/force=true"
            ) from exc
        if actual != expected:
            raise DataError(
                f"{path} has {actual} bytes but the header promises {expected} ({what}): the shard is corrupt "
                f"or truncated; re-prepare {self.name!r} with data/force=true"
            )

    def tokens(self, split: str) -> np.ndarray:
        """The split's tokens as a read-only memory map (size checked against the header)."""
        if split not in self._tokens:
            info = self._split_info(split)
            dtype = np.dtype(self.header.dtype)
            path = self.folder / f"{split}.bin"
            self._check_size(path, info.tokens * dtype.itemsize, f"{info.tokens} {dtype.name} tokens")
            if info.tokens == 0:
                return np.zeros(0, dtype=dtype)
            # a plain ndarray view of the map: slicing it is several times cheaper than slicing a np.memmap
            self._tokens[split] = np.asarray(np.memmap(path, dtype=dtype, mode="r", shape=(info.tokens,)))
        return self._tokens[split]

    def index(self, split: str) -> np.ndarray:
        """int64 ``[documents, 3]``: (start, length, prompt_length) per document."""
        if split not in self._index:
            info = self._split_info(split)
            path = self.folder / f"{split}.idx"
            self._check_size(path, info.documents * INDEX_COLUMNS * 8, f"{info.documents} documents")
            if info.documents == 0:
                return np.zeros((0, INDEX_COLUMNS), dtype=np.int64)
            self._index[split] = np.asarray(
                np.memmap(path, dtype=np.int64, mode="r", shape=(info.documents, INDEX_COLUMNS))
            )
        return self._index[split]

    def learned(self, split: str) -> np.ndarray | None:
        """uint8 per token, 1 where the token is learned as a target; None when the data has no masks."""
        if not self.header.masked:
            return None
        if split not in self._learned:
            info = self._split_info(split)
            path = self.folder / f"{split}.mask"
            self._check_size(path, info.tokens, f"{info.tokens} mask bytes")
            if info.tokens == 0:
                return np.zeros(0, dtype=np.uint8)
            self._learned[split] = np.asarray(np.memmap(path, dtype=np.uint8, mode="r", shape=(info.tokens,)))
        return self._learned[split]

    def verify(self) -> None:
        """Check every split's files against the header (sizes only; cheap)."""
        for split in self.header.splits:
            self.tokens(split)
            self.index(split)
            self.learned(split)

    def documents(self, split: str) -> Iterator[np.ndarray]:
        """Each document's tokens (including its end-of-text), in order."""
        tokens = self.tokens(split)
        for start, length, _ in self.index(split):
            yield np.asarray(tokens[start : start + length])

    def close(self) -> None:
        self._tokens.clear()
        self._index.clear()
        self._learned.clear()

    def __repr__(self) -> str:
        counts = ", ".join(f"{k}={v.tokens}" for k, v in self.header.splits.items())
        return f"Prepared({str(self.folder)!r}, {counts})"


__all__ = ["Prepared"]
