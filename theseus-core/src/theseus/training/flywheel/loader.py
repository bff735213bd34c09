"""The Flywheel: global batches from prepared data, a pure function of (seed, step, split, data settings).

Which process reads which rows is decided apart from what the rows hold: every process draws the
picks of all rows of the global batch from ``(seed, step, split)`` and materialises only its own
rows (:func:`feed_rows`). So the batch at step ``k`` is the same on 1 host or 64, with or without
gradient accumulation, in any layout, and a run resumed on another cluster shape continues the
same data.
"""

from __future__ import annotations

import threading
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from theseus.data.format import Prepared
from theseus.data.tokenizers.spec import spec_identity
from theseus.errors import DataError
from theseus.training.flywheel.sources import Source
from theseus.training.flywheel.strategy import Strategy, strategy_of

Batch = dict[str, np.ndarray]


def feed_rows(batch_size: int, process_index: int = 0, process_count: int = 1, micro_batches: int = 1) -> np.ndarray:
    """The rows of a global batch that process ``process_index`` of ``process_count`` feeds, in order.

    The global batch is split into ``micro_batches`` consecutive micro-batches, and each micro-batch
    into ``process_count`` consecutive shares; a process feeds its share of every micro-batch. Its
    rows, reshaped to ``[micro_batches, -1]``, are its part of each micro-batch, so every micro-batch
    holds the same rows whatever the process count.
    """
    for label, value, low in (("batch_size", batch_size, 1), ("micro_batches", micro_batches, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise DataError(f"Flywheel {label} must be an integer >= {low}, got {value!r}")
    if not (isinstance(process_count, int) and process_count >= 1 and 0 <= process_index < process_count):
        raise DataError(f"Flywheel process_index {process_index!r} must lie in [0, process_count={process_count!r})")
    if batch_size % (micro_batches * process_count):
        raise DataError(
            f"a global batch of {batch_size} rows cannot be split into {micro_batches} micro-batches over "
            f"{process_count} processes; make batch_size a multiple of {micro_batches * process_count}"
        )
    micro = batch_size // micro_batches
    share = micro // process_count
    first = np.arange(micro_batches)[:, None] * micro + process_index * share
    return (first + np.arange(share)).ravel()


def _split_code(split: str) -> int:
    return zlib.crc32(split.encode("utf-8"))


class Flywheel:
    """Batches of ``{"x", "y", "padding_mask"}`` drawn from prepared datasets by a sampling strategy.

    ``batch_size`` is the *global* batch. Row ``r`` of the global batch at ``step`` of ``split`` depends
    only on ``(seed, step, split, r)``, the data and ``block_size``/``batch_size`` - not on the number of
    processes or devices, the micro-batching or the layout - so a resumed run sees exactly the batches
    an uninterrupted run would have, on any cluster shape. ``batch(step, split)`` returns the rows this
    process feeds, ``self.rows`` (see :func:`feed_rows`); processes feed disjoint rows.

    Rows are assigned to samplings independently with probability ``rate``. ``x`` and ``y`` are int32
    ``[len(rows), block_size]`` with ``y`` shifted by one token; ``y == -1`` marks targets that are
    not learned (padding, and prompts of instruction data); ``padding_mask`` is True on real tokens,
    or, when a source is read in ``"packed"`` style, int32 segment ids (0 = padding, 1, 2, ... = the
    examples of a row; rows of other sources hold one segment). A source read in ``"pairs"`` style
    (the only source then) adds ``document``: the index of each row's document in its split, the key
    of anything computed once per document (a preference run's reference log-probabilities).
    Every call returns fresh arrays, so callers may modify them. A background thread prepares the
    next ``prefetch`` steps of the split last asked for.
    """

    def __init__(
        self,
        samplings: Any,
        *,
        root: str | Path,
        block_size: int,
        batch_size: int,
        seed: int = 0,
        process_index: int = 0,
        process_count: int = 1,
        micro_batches: int = 1,
        prefetch: int = 2,
    ) -> None:
        for label, value, low in (("block_size", block_size, 1), ("batch_size", batch_size, 1), ("seed", seed, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise DataError(f"Flywheel {label} must be an integer >= {low}, got {value!r}")
        self.rows = feed_rows(batch_size, process_index, process_count, micro_batches)
        self.strategy: Strategy = strategy_of(samplings)
        self.root = Path(root).expanduser()
        self.block_size = block_size
        self.batch_size = batch_size
        self.seed = seed
        self.process_index = process_index
        self.process_count = process_count
        self.micro_batches = micro_batches
        self.rates = np.asarray(self.strategy.rates, dtype=np.float64)
        self.rates = self.rates / self.rates.sum()
        self._cumulative = np.cumsum(self.rates)
        self.sources = [self._open(s) for s in self.strategy]
        if self.paired and len(self.sources) > 1:
            names = ", ".join(repr(s.name) for s in self.sources)
            raise DataError(
                f"the 'pairs' style keeps both documents of a pair in one batch, so it reads one dataset alone; "
                f"got {names}: train on one preference dataset"
            )
        self._check_tokenizers()
        for source in self.sources:
            for split in source.prepared.splits:
                source.view(split)
        self.prefetch = max(0, int(prefetch))
        self._lock = threading.Lock()
        self._pending: dict[tuple[int, str], Future[Batch]] = {}
        self._executor: ThreadPoolExecutor | None = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="flywheel") if self.prefetch else None
        )

    def _open(self, sampling: Any) -> Source:
        name = sampling.name
        prepared = Prepared.open(self.root, name, dataset=sampling.dataset_key)
        prepared.verify()
        return Source(
            prepared,
            sampling.style or prepared.header.style,
            label=sampling.label,
            dataset_key=sampling.dataset_key,
            root=str(self.root),
            block_size=self.block_size,
        )

    def _check_tokenizers(self) -> None:
        first = self.sources[0].prepared.header
        for source in self.sources[1:]:
            header = source.prepared.header
            if (
                spec_identity(header.tokenizer) != spec_identity(first.tokenizer)
                or header.vocab_size != first.vocab_size
            ):
                raise DataError(
                    f"datasets {first.name!r} and {header.name!r} were prepared with different tokenizers "
                    f"({first.tokenizer} vs {header.tokenizer}); re-prepare one with the other's tokenizer "
                    "(data/tokenizer=... data/force=true)"
                )

    # -- what the trainer asks -------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """The tokenizer's vocabulary size (the model's ``vocab_size`` must be at least this)."""
        return self.sources[0].prepared.header.vocab_size

    @property
    def packed(self) -> bool:
        """Whether a source is read in ``"packed"`` style: ``padding_mask`` then holds int32 segment ids."""
        return any(source.style == "packed" for source in self.sources)

    @property
    def paired(self) -> bool:
        """Whether the source is read in ``"pairs"`` style: batches then carry ``document``."""
        return any(source.style == "pairs" for source in self.sources)

    @property
    def eot_id(self) -> int:
        return self.sources[0].prepared.header.eot_id

    @property
    def data_identity(self) -> dict[str, dict[str, Any]]:
        """Each prepared dataset read, by name: what identifies its contents (``Header.identity``)."""
        return {source.prepared.name: source.prepared.header.identity() for source in self.sources}

    @property
    def tokenizer_spec(self) -> dict[str, Any]:
        """The spec of the tokenizer that prepared the data (``load_tokenizer(spec)`` rebuilds it)."""
        return self.sources[0].prepared.tokenizer_spec

    def tokenizer(self) -> Any:
        """The tokenizer that prepared the data (checked against the header)."""
        return self.sources[0].prepared.tokenizer()

    def check_model(self, vocab_size: int, block_size: int) -> None:
        """Raise DataError when a model with these sizes cannot train on this data."""
        if vocab_size < self.vocab_size:
            names = ", ".join(repr(s.name) for s in self.sources)
            raise DataError(
                f"model vocabulary {vocab_size} is smaller than the tokenizer's {self.vocab_size} "
                f"(data {names}, tokenizer {self.sources[0].prepared.header.tokenizer}); "
                f"set architecture/vocab_size={self.vocab_size} or larger"
            )
        if block_size < self.block_size:
            raise DataError(
                f"batches have {self.block_size} positions but the model's block_size is {block_size}; "
                f"set architecture/block_size>={self.block_size} or read shorter batches"
            )

    def batch(self, step: int, split: str = "train") -> Batch:
        """This process's rows of batch ``step`` of ``split``: int32 ``x``, ``y`` and ``padding_mask`` (bool,
        or int32 segment ids when a source is packed), ``[len(self.rows), block_size]``."""
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise DataError(f"batch step must be an integer >= 0, got {step!r}")
        step = int(step)
        future = None
        with self._lock:
            future = self._pending.pop((step, split), None)
        result = future.result() if future is not None else self.assemble(step, split)
        self._schedule(step, split)
        return result

    def assemble(self, step: int, split: str = "train") -> Batch:
        """Build batch ``step`` of ``split`` now, in this thread (what ``batch`` returns, without prefetch)."""
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, step, _split_code(split)]))
        b, t = len(self.rows), self.block_size
        x = np.empty((b, t), dtype=np.int32)
        y = np.empty((b, t), dtype=np.int32)
        mask = np.empty((b, t), dtype=np.int32 if self.packed else bool)
        # Every process draws for every row of the global batch (cheap), then cuts only its own rows.
        if len(self.sources) == 1:
            owner = np.zeros(b, dtype=np.intp)
        else:
            chosen = np.searchsorted(self._cumulative, rng.random(self.batch_size), side="right")
            owner = np.minimum(chosen, len(self.sources) - 1)[self.rows]
        batch: Batch = {"x": x, "y": y, "padding_mask": mask}
        for i, source in enumerate(self.sources):
            picks = source.draw(rng, split, self.batch_size)[self.rows]
            local = np.flatnonzero(owner == i)
            source.fill(picks[local], local, split, x, y, mask)
            if source.style == "pairs":
                batch["document"] = picks.astype(np.int32)
        return batch

    def _schedule(self, step: int, split: str) -> None:
        executor = self._executor
        if executor is None:
            return
        with self._lock:
            for key in [k for k in self._pending if k[1] == split and not step < k[0] <= step + self.prefetch]:
                self._pending.pop(key).cancel()
            for ahead in range(step + 1, step + 1 + self.prefetch):
                key = (ahead, split)
                if key not in self._pending:
                    try:
                        self._pending[key] = executor.submit(self.assemble, ahead, split)
                    except RuntimeError:  # shut down meanwhile
                        return

    def close(self) -> None:
        """Stop the prefetch thread and release the memory maps."""
        executor, self._executor = self._executor, None
        with self._lock:
            for future in self._pending.values():
                future.cancel()
            self._pending.clear()
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
        for source in self.sources:
            source.prepared.close()

    def __enter__(self) -> Flywheel:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        parts = ", ".join(f"{s.name}:{s.style}@{r:g}" for s, r in zip(self.sources, self.rates, strict=True))
        return (
            f"Flywheel([{parts}], block_size={self.block_size}, batch_size={self.batch_size}, seed={self.seed}, "
            f"process={self.process_index}/{self.process_count}, micro_batches={self.micro_batches})"
        )
