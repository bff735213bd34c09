"""The prepared-data format: token shards plus a JSON header under ``<root>/data/<name>/``.

Layout of a prepared dataset folder::

    header.json        written last: its presence marks the folder complete
    train.bin          every train token, documents back to back, each followed by end-of-text
    train.idx          int64 [documents, 3]: (start, length, prompt_length) of each document
    val.bin, val.idx   the same for the validation split
    train.mask, ...    uint8 per token, 1 = learned as a target (only data with masks: chat)
    tokenizer.json     a copy of the tokenizer file, for file-based tokenizers

Tokens are ``uint16`` when the vocabulary fits (``vocab_size <= 65536``), else ``uint32``. A document's
``length`` counts its end-of-text token; ``prompt_length`` is the number of leading tokens that are
a prompt (not learned in the ``"padded"`` and ``"packed"`` styles), 0 for plain text. Data whose
learned tokens are not one suffix per document (chat: only assistant turns are learned) also
stores a per-token mask (``masked`` in the header).

Writing goes to a hidden staging folder that is fsynced and renamed into place, with the header
written last, so an interrupted run never leaves a folder that looks complete.

A resumable writer (``PreparedWriter(..., resume=fingerprint)``) stages in ``.<name>.partial`` and
commits its progress in chunks: ``checkpoint(position)`` fsyncs the shards and then replaces
``progress.json`` (the manifest: the fingerprint, the input position and every file's committed
size). A writer opened again with the same fingerprint cuts the shards back to the manifest's
sizes and continues from ``resumed_position``; with another fingerprint it starts over. The
manifest is removed before the folder is published, so the published files do not depend on
where (or whether) the preparation was interrupted.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from theseus.errors import DataError

FORMAT = "theseus-tokens"
FORMAT_VERSION = 1
HEADER_FILE = "header.json"
MANIFEST_FILE = "progress.json"
INDEX_COLUMNS = 3  # start, length, prompt_length
STYLES = ("pmd", "padded", "packed")


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
        data = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise DataError(f"{path} does not exist: the data is not prepared") from exc
    except (OSError, ValueError) as exc:
        raise DataError(f"{path} is unreadable ({exc}); re-prepare the data with data/force=true") from exc
    if not isinstance(data, dict):
        raise DataError(f"{path} does not hold a JSON object; re-prepare the data with data/force=true")
    return Header.from_json(data, str(path))


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
        from theseus.data.tokenizer import load_tokenizer

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
                "data/force=true and a data/val_fraction above 0"
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


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def resumable_staging(root: str | Path, name: str) -> Path:
    """The staging folder of a resumable preparation of ``name``: ``<root>/data/.<name>.partial``."""
    folder = data_folder(root, name)
    return folder.parent / f".{name}.partial"


class PreparedWriter:
    """Writes a prepared dataset atomically: stage, fsync, header last, rename into place.

    Use as a context manager; leaving the block with an exception removes the staging folder,
    except for a resumable writer (``resume`` given: a JSON-able fingerprint of what is prepared),
    whose committed chunks stay for the next run to continue from.
    """

    def __init__(
        self,
        root: str | Path,
        name: str,
        *,
        vocab_size: int,
        eot_id: int,
        masked: bool = False,
        resume: Mapping[str, Any] | None = None,
    ) -> None:
        self.folder = data_folder(root, name)
        self.masked = masked
        self.name = name
        self.vocab_size = vocab_size
        self.eot_id = eot_id
        self.dtype = token_dtype(vocab_size)
        self.folder.parent.mkdir(parents=True, exist_ok=True)
        self._bins: dict[str, Any] = {}
        self._idx: dict[str, Any] = {}
        self._masks: dict[str, Any] = {}
        self._counts: dict[str, list[int]] = {}
        self._closed = False
        self.fingerprint = json.loads(json.dumps(dict(resume))) if resume is not None else None
        #: The input position the last committed chunk ends at (0 for a fresh start).
        self.resumed_position = 0
        if self.fingerprint is None:
            self.staging = self.folder.parent / f".{name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            self.staging.mkdir()
            return
        self.staging = resumable_staging(root, name)
        manifest = self._read_manifest()
        if manifest is None or manifest.get("fingerprint") != self.fingerprint:
            shutil.rmtree(self.staging, ignore_errors=True)
            self.staging.mkdir()
            return
        for split, (tokens, documents) in manifest["splits"].items():
            self._reopen(split, int(tokens), int(documents))
        self.resumed_position = int(manifest["position"])

    # -- resuming ---------------------------------------------------------------------------------
    def _read_manifest(self) -> dict[str, Any] | None:
        """The staging folder's manifest, or None when there is none or it is unusable."""
        try:
            data = json.loads((self.staging / MANIFEST_FILE).read_text())
            splits = {str(k): (int(v[0]), int(v[1])) for k, v in dict(data["splits"]).items()}
            for split, (tokens, documents) in splits.items():
                if (self.staging / f"{split}.bin").stat().st_size < tokens * self.dtype.itemsize or (
                    self.staging / f"{split}.idx"
                ).stat().st_size < documents * INDEX_COLUMNS * 8:
                    return None
                if self.masked and (self.staging / f"{split}.mask").stat().st_size < tokens:
                    return None
            return {"fingerprint": data["fingerprint"], "position": int(data["position"]), "splits": splits}
        except (OSError, ValueError, KeyError, TypeError, IndexError):
            return None

    def _reopen(self, split: str, tokens: int, documents: int) -> None:
        """Open a split's staged files for appending after cutting them back to the committed sizes."""
        files = [("bin", tokens * self.dtype.itemsize, self._bins), ("idx", documents * INDEX_COLUMNS * 8, self._idx)]
        if self.masked:
            files.append(("mask", tokens, self._masks))  # one byte per token, cut with the tokens
        for suffix, size, handles in files:
            path = self.staging / f"{split}.{suffix}"
            with open(path, "r+b") as f:
                f.truncate(size)
            handles[split] = open(path, "ab")  # noqa: SIM115 - closed in commit/abort
        self._counts[split] = [tokens, documents]

    def checkpoint(self, position: int) -> None:
        """Commit what was appended so far as the progress up to input ``position`` (resumable writers)."""
        if self.fingerprint is None:
            raise ValueError("checkpoint() needs a resumable writer (PreparedWriter(..., resume=...))")
        for handle in (*self._bins.values(), *self._idx.values(), *self._masks.values()):
            handle.flush()
            os.fsync(handle.fileno())
        manifest = {
            "fingerprint": self.fingerprint,
            "position": int(position),
            "splits": {k: [v[0], v[1]] for k, v in self._counts.items()},
        }
        tmp = self.staging / (MANIFEST_FILE + ".tmp")
        with open(tmp, "w") as f:
            json.dump(manifest, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.staging / MANIFEST_FILE)
        _fsync_dir(self.staging)

    def __enter__(self) -> PreparedWriter:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if exc_type is not None or not self._closed:
            self.abort(keep_progress=self.fingerprint is not None)

    def open_split(self, split: str) -> None:
        """Declare a split (so that it appears in the header even if it stays empty)."""
        if split not in self._bins:
            self._bins[split] = open(self.staging / f"{split}.bin", "wb")  # noqa: SIM115 - closed in commit/abort
            self._idx[split] = open(self.staging / f"{split}.idx", "wb")  # noqa: SIM115
            if self.masked:
                self._masks[split] = open(self.staging / f"{split}.mask", "wb")  # noqa: SIM115
            self._counts[split] = [0, 0]

    def append(
        self,
        split: str,
        tokens: np.ndarray,
        lengths: np.ndarray,
        prompt_lengths: np.ndarray,
        learned: np.ndarray | None = None,
    ) -> None:
        """Append documents: ``tokens`` is their concatenation, ``lengths`` their sizes (EOT included).

        A writer made with ``masked=True`` also takes ``learned``: 1 per token learned as a target.
        """
        self.open_split(split)
        if self.masked and (learned is None or np.shape(learned) != np.shape(tokens)):
            raise ValueError("a masked writer needs one learned flag per token")
        tokens = np.asarray(tokens)
        lengths = np.asarray(lengths, dtype=np.int64)
        if int(lengths.sum()) != tokens.size:
            raise ValueError(f"lengths sum to {int(lengths.sum())} but {tokens.size} tokens were given")
        if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= self.vocab_size):
            raise DataError(
                f"tokenizer produced id {int(tokens.max())} outside its vocabulary {self.vocab_size}; fix the tokenizer"
            )
        count = self._counts[split]
        starts = count[0] + np.concatenate(([0], np.cumsum(lengths)[:-1])) if lengths.size else lengths
        rows = np.stack([starts, lengths, np.asarray(prompt_lengths, dtype=np.int64)], axis=1).astype(np.int64)
        self._bins[split].write(tokens.astype(self.dtype, copy=False).tobytes())
        self._idx[split].write(np.ascontiguousarray(rows).tobytes())
        if self.masked:
            self._masks[split].write(np.asarray(learned, dtype=np.uint8).tobytes())
        count[0] += int(tokens.size)
        count[1] += int(lengths.size)

    def counts(self) -> dict[str, SplitInfo]:
        return {k: SplitInfo(tokens=v[0], documents=v[1]) for k, v in self._counts.items()}

    def add_file(self, source: str | Path, name: str) -> None:
        """Copy a file (e.g. ``tokenizer.json``) into the prepared folder."""
        shutil.copyfile(source, self.staging / name)

    def commit(
        self,
        *,
        tokenizer: Mapping[str, Any],
        source: Mapping[str, Any] | None = None,
        style: str = "pmd",
    ) -> Prepared:
        """Flush and fsync the shards, write the header last, and move the folder into place."""
        if style not in STYLES:
            raise DataError(f"style {style!r} is not one of {', '.join(STYLES)}")
        for handle in (*self._bins.values(), *self._idx.values(), *self._masks.values()):
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()
        header = Header(
            name=self.name,
            tokenizer=dict(tokenizer),
            vocab_size=self.vocab_size,
            eot_id=self.eot_id,
            dtype=self.dtype.name,
            splits=self.counts(),
            source=dict(source or {}),
            style=style,
            masked=self.masked,
            created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        )
        for leftover in (MANIFEST_FILE, MANIFEST_FILE + ".tmp"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.staging / leftover)
        tmp = self.staging / (HEADER_FILE + ".tmp")
        with open(tmp, "w") as f:
            json.dump(header.to_json(), f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.staging / HEADER_FILE)
        _fsync_dir(self.staging)
        old = None
        if self.folder.exists():
            old = self.folder.parent / f".{self.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            os.replace(self.folder, old)
        os.replace(self.staging, self.folder)
        _fsync_dir(self.folder.parent)
        self._closed = True
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return Prepared(self.folder, header)

    def abort(self, keep_progress: bool = False) -> None:
        """Close and remove the staging folder (the previous prepared data, if any, is untouched).

        With ``keep_progress`` the staging folder stays if :meth:`checkpoint` committed chunks, so
        that they can be continued from; what was appended after them is cut off then.
        """
        for handle in (*self._bins.values(), *self._idx.values(), *self._masks.values()):
            with contextlib.suppress(Exception):
                handle.close()
        committed = (self.staging / MANIFEST_FILE).is_file()
        if self.staging.exists() and not (keep_progress and committed):
            shutil.rmtree(self.staging, ignore_errors=True)
        self._closed = True


def remove_stale_staging(root: str | Path, name: str) -> None:
    """Remove staging folders left by interrupted runs for ``name`` (call while holding the lock)."""
    parent = data_folder(root, name).parent
    if not parent.is_dir():
        return
    for pattern in (f".{name}.partial-*", f".{name}.old-*"):
        for path in parent.glob(pattern):
            shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def preparation_lock(root: str | Path, name: str) -> Iterator[None]:
    """An exclusive lock on preparing ``name`` under ``root`` (a second preparer gets a DataError)."""
    folder = data_folder(root, name)
    folder.parent.mkdir(parents=True, exist_ok=True)
    path = folder.parent / f".{name}.lock"
    handle = open(path, "a+")  # noqa: SIM115 - closed below
    try:
        try:
            import fcntl

            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except ImportError:  # no advisory locks on this platform
            pass
        except OSError as exc:
            raise DataError(
                f"another process is preparing {name!r} in {folder.parent} (lock {path}); wait for it to finish"
            ) from exc
        yield
    finally:
        handle.close()


__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "HEADER_FILE",
    "MANIFEST_FILE",
    "STYLES",
    "Header",
    "Prepared",
    "PreparedWriter",
    "SplitInfo",
    "data_folder",
    "preparation_lock",
    "prepare_command",
    "read_header",
    "remove_stale_staging",
    "resumable_staging",
    "token_dtype",
]
