"""Preparing a dataset: stream documents, tokenize them in parallel, write token shards atomically.

``prepare(dataset, root)`` is what ``theseus run data/tokenize`` (theseus-data) runs; the offline jobs
(``demo/gpt``, ``train/pretrain``) call it directly to prepare the standard-library corpus, so it
lives in theseus-core and needs nothing beyond numpy.

Progress is committed in chunks (at most every ``commit_seconds``) to a staging folder with a
manifest (``theseus.data.format.PreparedWriter``): killed part way, the same call continues after
the last committed chunk, and the published files are byte-identical to an uninterrupted run.
"""

from __future__ import annotations

import errno
import itertools
import multiprocessing
import os
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Executor, ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from theseus.base.killpoints import kill_point
from theseus.config import configure
from theseus.data.datasets.base import Dataset, Document, resolve_dataset
from theseus.data.format import (
    HEADER_FILE,
    Prepared,
    PreparedWriter,
    data_folder,
    preparation_lock,
    remove_stale_staging,
    token_dtype,
)
from theseus.data.tokenizers.base import Tokenizer, encode_arrays
from theseus.data.tokenizers.spec import load_tokenizer, spec_identity
from theseus.errors import DataError

#: Documents are sent to workers in chunks of about this many characters (or CHUNK_DOCUMENTS documents).
CHUNK_CHARS = 1 << 20
CHUNK_DOCUMENTS = 1024
#: Committed progress is at most this old when a preparation is killed (``prepare(commit_seconds=...)``).
COMMIT_SECONDS = 10.0

Encoded = dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]
Chunk = list[tuple[Any, ...]]  # (split, prompt, text) or (split, prompt, text, segments)
_WORKER_TOKENIZER: Tokenizer | None = None


def as_dataset(dataset: Dataset | type[Dataset] | str) -> Dataset:
    """A dataset instance: names and classes are configured from the active configuration (or defaults)."""
    resolved = resolve_dataset(dataset)
    if isinstance(resolved, Dataset):
        return resolved
    if isinstance(resolved, type) and issubclass(resolved, Dataset):
        return configure(resolved)
    raise DataError(f"{dataset!r} is not a theseus.data.datasets.base.Dataset; register a Dataset subclass")


def header_spec(tokenizer: Tokenizer) -> dict[str, Any]:
    """The tokenizer spec as written in the header (copied files referred to by their name in the folder)."""
    spec = dict(tokenizer.spec)
    files = getattr(tokenizer, "files", None) or {}
    if "path" in spec and files:
        spec["path"] = next(iter(files))
    return spec


def check_existing(prepared: Prepared, dataset: Dataset, tokenizer: Tokenizer, command_hint: str) -> None:
    """Raise DataError when existing prepared data was made differently from what is asked now."""
    header = prepared.header
    if spec_identity(header.tokenizer) != spec_identity(header_spec(tokenizer)):
        raise DataError(
            f"{prepared.folder} was prepared with tokenizer {spec_identity(header.tokenizer)}, not "
            f"{spec_identity(header_spec(tokenizer))}; re-prepare it with {command_hint} data/force=true"
        )
    old = header.source.get("config", {})
    new = dataset.describe().get("config", {})
    changed = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    if header.source.get("dataset") != dataset.name or changed:
        what = ", ".join(f"{k}={old.get(k)!r} (now {new.get(k)!r})" for k in changed) or "another dataset"
        raise DataError(
            f"{prepared.folder} was prepared from {header.source.get('dataset')!r} with {what}; "
            f"re-prepare it with data/force=true or choose another data/name"
        )
    prepared.verify()


def prepare(
    dataset: Dataset | type[Dataset] | str,
    root: str | Path,
    *,
    tokenizer: str | Mapping[str, Any] | Tokenizer = "byte",
    name: str | None = None,
    workers: int = 0,
    force: bool = False,
    progress: bool = False,
    commit_seconds: float = COMMIT_SECONDS,
) -> Prepared:
    """Tokenize ``dataset`` into ``<root>/data/<name>/`` and return the prepared data.

    ``name`` defaults to the dataset's name. Data that is already prepared the same way is returned
    as is unless ``force``; data prepared differently is a DataError. ``workers`` tokenizer processes
    are used (0: automatic). ``progress`` shows a progress bar with documents/s and tokens/s.
    Finished chunks are committed at most every ``commit_seconds`` (0: after every chunk); an
    interrupted preparation of the same dataset, tokenizer and settings continues from there.
    """
    ds = as_dataset(dataset)
    name = name or ds.name
    if not name:
        raise DataError(f"{type(ds).__qualname__} has no name; set a 'name' class attribute or pass data/name=...")
    tok = load_tokenizer(tokenizer)
    folder = data_folder(root, name)
    hint = f"'theseus run data/tokenize data/dataset={ds.name}" + (f" data/name={name}'" if name != ds.name else "'")
    if not force and (folder / HEADER_FILE).is_file():
        existing = Prepared(folder)
        check_existing(existing, ds, tok, hint)
        return existing
    with preparation_lock(root, name):
        remove_stale_staging(root, name)
        return _write(ds, tok, root, name, workers=workers, progress=progress, commit_seconds=commit_seconds)


def is_prepared(root: str | Path, name: str) -> bool:
    """Whether ``<root>/data/<name>`` holds complete prepared data."""
    return (data_folder(root, name) / HEADER_FILE).is_file()


# -- tokenizing --------------------------------------------------------------------------------------
def _init_worker(spec: Mapping[str, Any]) -> None:
    global _WORKER_TOKENIZER
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    _WORKER_TOKENIZER = load_tokenizer(spec)


def _encode_in_worker(chunk: Chunk) -> Encoded:
    assert _WORKER_TOKENIZER is not None
    return encode_chunk(_WORKER_TOKENIZER, chunk)


def encode_chunk(tokenizer: Tokenizer, chunk: Chunk) -> Encoded:
    """Encode ``(split, prompt, text[, segments])`` documents: per split, (tokens, lengths, prompt
    lengths, learned), ``learned`` being uint8 per token (1 = learned as a target).

    Each document becomes its prompt's tokens, its text's tokens and the end-of-text id; a document
    with ``segments`` becomes each segment's tokens in order (learned where the segment is), then
    the end-of-text id (learned when the last segment is).
    """
    dtype = token_dtype(tokenizer.vocab_size)
    eot = np.asarray([tokenizer.eot_id], dtype=np.int64)
    segmented = {i: item[3] for i, item in enumerate(chunk) if len(item) > 3 and item[3]}
    if segmented:
        return _encode_segmented(tokenizer, chunk, segmented)
    texts = encode_arrays(tokenizer, [item[2] for item in chunk])
    with_prompt = [i for i, item in enumerate(chunk) if item[1]]
    prompts: dict[int, np.ndarray] = {}
    if with_prompt:
        encoded = encode_arrays(tokenizer, [chunk[i][1] for i in with_prompt])
        prompts = dict(zip(with_prompt, encoded, strict=True))
    grouped: dict[str, tuple[list[np.ndarray], list[int], list[int]]] = {}
    for i, item in enumerate(chunk):
        split = item[0]
        parts, lengths, prompt_lengths = grouped.setdefault(split, ([], [], []))
        prompt = prompts.get(i)
        if prompt is not None:
            parts.append(prompt)
        parts.append(texts[i])
        parts.append(eot)
        plen = 0 if prompt is None else int(prompt.size)
        lengths.append(plen + int(texts[i].size) + 1)
        prompt_lengths.append(plen)
    out: Encoded = {}
    for split, (parts, lengths, prompt_lengths) in grouped.items():
        tokens = np.concatenate([p.astype(np.int64, copy=False) for p in parts])
        if tokens.size and (tokens.min() < 0 or tokens.max() >= tokenizer.vocab_size):
            raise DataError(f"tokenizer produced id {int(tokens.max())} outside its vocabulary {tokenizer.vocab_size}")
        lengths_array = np.asarray(lengths, np.int64)
        prompts_array = np.asarray(prompt_lengths, np.int64)
        out[split] = (tokens.astype(dtype), lengths_array, prompts_array, _suffix_mask(lengths_array, prompts_array))
    return out


def _suffix_mask(lengths: np.ndarray, prompt_lengths: np.ndarray) -> np.ndarray:
    """1 on every token after each document's prompt."""
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    within = np.arange(int(lengths.sum())) - starts
    return (within >= np.repeat(prompt_lengths, lengths)).astype(np.uint8)


def _encode_segmented(tokenizer: Tokenizer, chunk: Chunk, segmented: dict[int, Any]) -> Encoded:
    """``encode_chunk`` for chunks holding segmented (chat) documents."""
    dtype = token_dtype(tokenizer.vocab_size)
    plain = {i: ((item[1], False), (item[2], True)) if item[1] else ((item[2], True),) for i, item in enumerate(chunk)}
    documents = [segmented.get(i, plain[i]) for i in range(len(chunk))]
    encoded = iter(encode_arrays(tokenizer, [text for segments in documents for text, _ in segments]))
    grouped: dict[str, tuple[list[np.ndarray], list[np.ndarray], list[int]]] = {}
    for item, segments in zip(chunk, documents, strict=True):
        parts, learned, lengths = grouped.setdefault(item[0], ([], [], []))
        flags = [bool(flag) for _, flag in segments]
        size = 0
        for flag in flags:
            ids = next(encoded).astype(np.int64, copy=False)
            parts.append(ids)
            learned.append(np.full(ids.size, flag, np.uint8))
            size += int(ids.size)
        parts.append(np.asarray([tokenizer.eot_id], dtype=np.int64))
        learned.append(np.asarray([flags[-1]], np.uint8))
        lengths.append(size + 1)
    out: Encoded = {}
    for split, (parts, learned, lengths) in grouped.items():
        tokens = np.concatenate(parts)
        if tokens.size and (tokens.min() < 0 or tokens.max() >= tokenizer.vocab_size):
            raise DataError(f"tokenizer produced id {int(tokens.max())} outside its vocabulary {tokenizer.vocab_size}")
        count = np.asarray(lengths, np.int64)
        out[split] = (tokens.astype(dtype), count, np.zeros_like(count), np.concatenate(learned))
    return out


def _chunks(documents: Iterable[Document], limit_chars: int, limit_docs: int) -> Iterator[Chunk]:
    chunk: Chunk = []
    size = 0
    for doc in documents:
        chunk.append((doc.split or "train", doc.prompt, doc.text, doc.segments))
        size += len(doc.text) + len(doc.prompt)
        if size >= limit_chars or len(chunk) >= limit_docs:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def auto_workers(tokenizer: Tokenizer) -> int:
    """Processes to tokenize with when ``data/workers=0``.

    One (this process) for the byte tokenizer, which is cheaper than sending text to another process,
    and for tokenizers with a native batch encoder (``encode_batch``: Hugging Face, tiktoken), which
    already use every core from threads; every core (at most 8) for other tokenizers.
    """
    if tokenizer.spec.get("kind") == "byte" or callable(getattr(tokenizer, "encode_batch", None)):
        return 1
    return max(1, min(os.cpu_count() or 1, 8))


def _encoded_chunks(tokenizer: Tokenizer, chunks: Iterator[Chunk], workers: int) -> Iterator[Encoded]:
    if workers <= 1:
        for chunk in chunks:
            yield encode_chunk(tokenizer, chunk)
        return
    context = multiprocessing.get_context("spawn")
    executor: Executor = ProcessPoolExecutor(
        max_workers=workers, mp_context=context, initializer=_init_worker, initargs=(tokenizer.spec,)
    )
    try:
        pending: deque[Any] = deque()
        for chunk in chunks:
            pending.append(executor.submit(_encode_in_worker, chunk))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        executor.shutdown(wait=True, cancel_futures=True)


def fingerprint(ds: Dataset, tok: Tokenizer) -> dict[str, Any]:
    """What must match for an interrupted preparation to be continued: dataset, settings, tokenizer, format."""
    from theseus.data.format import FORMAT_VERSION

    found: dict[str, Any] = {
        "source": ds.describe(),
        "tokenizer": spec_identity(header_spec(tok)),
        "format": FORMAT_VERSION,
    }
    if ds.masked:  # the staged shards then include the per-token masks
        found["masked"] = True
    return found


def _write(
    ds: Dataset,
    tok: Tokenizer,
    root: str | Path,
    name: str,
    *,
    workers: int,
    progress: bool,
    commit_seconds: float = COMMIT_SECONDS,
) -> Prepared:
    workers = workers if workers > 0 else auto_workers(tok)
    reporter: _Progress | None = None
    documents = 0
    writer = PreparedWriter(
        root, name, vocab_size=tok.vocab_size, eot_id=tok.eot_id, masked=ds.masked, resume=fingerprint(ds, tok)
    )
    try:
        with writer:
            position = writer.resumed_position  # input documents already committed
            resumed = writer.counts()
            documents = position
            if progress:
                reporter = _Progress(f"tokenize {name}", ds.estimated_documents(), resumed_at=position)
                if position:
                    tokens = sum(info.tokens for info in resumed.values())
                    reporter.message(f"resuming {name!r} after {position:,} documents ({tokens:,} tokens) committed")
            for split in ds.splits:
                writer.open_split(split)
            chunks = _chunks(itertools.islice(ds.documents(), position, None), CHUNK_CHARS, CHUNK_DOCUMENTS)
            committed_at = time.monotonic()
            for number, encoded in enumerate(_encoded_chunks(tok, chunks, workers), start=1):
                tokens = 0
                in_chunk = 0
                for split, (ids, lengths, prompt_lengths, learned) in encoded.items():
                    writer.append(split, ids, lengths, prompt_lengths, learned)
                    tokens += int(ids.size)
                    in_chunk += int(lengths.size)
                position += in_chunk
                documents += in_chunk
                kill_point("chunk", number)
                if time.monotonic() - committed_at >= commit_seconds:
                    writer.checkpoint(position)
                    committed_at = time.monotonic()
                    kill_point("commit", number)
                if reporter is not None:
                    reporter.advance(in_chunk, tokens)
            counts = writer.counts()
            if documents == 0:
                writer.abort()
                raise DataError(f"dataset {ds.name!r} yielded no documents; check its configuration (path, subset)")
            for split, info in counts.items():
                if info.documents == 0:
                    writer.abort()
                    raise DataError(
                        f"split {split!r} of {name!r} got no documents ({documents} read); raise "
                        "data/max_documents or data/val_fraction (0 leaves out the validation split)"
                    )
            for file_name, source in (getattr(tok, "files", None) or {}).items():
                writer.add_file(source, file_name)
            return writer.commit(tokenizer=header_spec(tok), source=ds.describe(), style=ds.style)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        kept = data_folder(root, name)
        previous = f"; the previous data in {kept} is untouched" if (kept / HEADER_FILE).is_file() else ""
        raise DataError(
            f"no space left on the device while preparing {name!r} in {writer.staging}; free disk space and run "
            f"the same command again to continue from the last committed chunk{previous}"
        ) from exc
    finally:
        if reporter is not None:
            reporter.close()


class _Progress:
    """A rich progress bar with documents/s and tokens/s."""

    def __init__(self, description: str, total: int | None, resumed_at: int = 0) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        columns: list[Any] = [SpinnerColumn(), TextColumn("[bold]{task.description}")]
        if total is not None:
            columns += [BarColumn(), MofNCompleteColumn()]
        else:
            columns += [TextColumn("{task.completed:,.0f} docs")]
        columns += [
            TextColumn("{task.fields[docs_rate]} docs/s"),
            TextColumn("{task.fields[tokens]} tokens"),
            TextColumn("{task.fields[tokens_rate]} tokens/s"),
            TimeElapsedColumn(),
        ]
        self.progress = Progress(*columns)
        if resumed_at:
            description += f" (resumed at {resumed_at:,})"
        self.task = self.progress.add_task(
            description, total=total, completed=resumed_at, docs_rate="-", tokens="0", tokens_rate="-"
        )
        self.start = time.perf_counter()
        self.documents = 0
        self.tokens = 0
        self.progress.start()

    def advance(self, documents: int, tokens: int) -> None:
        self.documents += documents
        self.tokens += tokens
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        self.progress.update(
            self.task,
            advance=documents,
            docs_rate=_human(self.documents / elapsed),
            tokens=_human(self.tokens),
            tokens_rate=_human(self.tokens / elapsed),
        )

    def message(self, text: str) -> None:
        """A line above the bar."""
        self.progress.console.print(text, highlight=False)

    def close(self) -> None:
        self.progress.stop()


def _human(value: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.1f}{unit}"
    return f"{value:.0f}"


__all__ = ["as_dataset", "encode_chunk", "fingerprint", "is_prepared", "prepare"]
