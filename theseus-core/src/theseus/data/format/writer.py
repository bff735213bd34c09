"""Writing prepared data: ``PreparedWriter`` stages shards, commits resumable progress and publishes the
folder atomically; ``preparation_lock`` keeps two preparers of one dataset apart.

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
import shutil
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from theseus.base import jsonfile
from theseus.data.format.header import HEADER_FILE, INDEX_COLUMNS, STYLES, Header, SplitInfo, data_folder, token_dtype
from theseus.data.format.reader import Prepared
from theseus.errors import DataError

MANIFEST_FILE = "progress.json"


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
            data = jsonfile.read_object(self.staging / MANIFEST_FILE)  # UnreadableJSON is a ValueError
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


__all__ = ["MANIFEST_FILE", "PreparedWriter", "preparation_lock", "remove_stale_staging", "resumable_staging"]
