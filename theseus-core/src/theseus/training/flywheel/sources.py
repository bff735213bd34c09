"""One prepared dataset read in one style: how rows of a batch are cut from its shards.

Every process reads only its own part of each split, so processes never share data:

* ``"pmd"``: the split's tokens are cut into ``process_count`` contiguous slices of equal length;
  process ``p`` draws windows of ``block_size + 1`` tokens that lie entirely inside slice ``p``.
* ``"padded"``: the split's documents are cut into ``process_count`` contiguous runs; process ``p``
  draws whole documents from run ``p``.
* ``"packed"``: documents are drawn like ``"padded"`` and placed first-fit into the rows, several per
  row; the padding mask holds segment ids (1, 2, ... per example, 0 on padding) so that attention
  stays within an example and positions restart per example.

Targets that are not learned (prompts, non-assistant chat turns) are ``-1``: from the per-token
mask stored with the tokens when the data has one, else from each document's prompt length.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from theseus.data.format import Prepared, prepare_command
from theseus.errors import DataError


@dataclass(frozen=True)
class _SplitView:
    tokens: np.ndarray
    index: np.ndarray  # padded/packed: this process's documents (start, length, prompt_length)
    lo: int  # pmd: first token of this process's slice
    hi: int  # pmd: one past the last token
    learned: np.ndarray | None = None  # per-token "learned as a target" mask, when the data has one


#: A packed batch stops drawing documents after this many draws found no row with room.
PACK_MISSES = 16


class Source:
    """Rows from one prepared dataset, in ``"pmd"``, ``"padded"`` or ``"packed"`` style."""

    def __init__(
        self,
        prepared: Prepared,
        style: str,
        *,
        label: str,
        dataset_key: str,
        root: str,
        block_size: int,
        process_index: int,
        process_count: int,
    ) -> None:
        self.prepared = prepared
        self.style = style
        self.label = label
        self.dataset_key = dataset_key
        self.root = root
        self.block_size = block_size
        self.process_index = process_index
        self.process_count = process_count
        self.pad_id = prepared.header.eot_id
        self._views: dict[str, _SplitView] = {}

    @property
    def name(self) -> str:
        return self.prepared.name

    def _fix(self) -> str:
        return f"{prepare_command(self.name, self.root, self.dataset_key)} data/force=true"

    def view(self, split: str) -> _SplitView:
        """This process's part of ``split`` (validated once, then cached)."""
        view = self._views.get(split)
        if view is None:
            view = self._views[split] = self._make_view(split)
        return view

    def _make_view(self, split: str) -> _SplitView:
        tokens = self.prepared.tokens(split)
        index = self.prepared.index(split)
        if tokens.size == 0 or index.shape[0] == 0:
            raise DataError(
                f"split {split!r} of dataset {self.name!r} is empty; prepare more documents "
                f"(raise data/max_documents or data/val_fraction): {self._fix()}"
            )
        p, n = self.process_index, self.process_count
        need = self.block_size + 1
        if self.style == "pmd":
            per = tokens.size // n
            lo, hi = p * per, (p + 1) * per
            if per < need:
                raise DataError(
                    f"split {split!r} of dataset {self.name!r} has {tokens.size} tokens, too few for windows of "
                    f"block_size+1={need} tokens"
                    + (f" in each of {n} processes" if n > 1 else "")
                    + f"; lower block_size or prepare more data: {self._fix()}"
                )
            return _SplitView(tokens, index[:0], lo, hi)
        docs = index.shape[0]
        if docs < n:
            raise DataError(
                f"split {split!r} of dataset {self.name!r} has {docs} documents, fewer than the {n} processes "
                f"reading it; prepare more data: {self._fix()}"
            )
        learned = self.prepared.learned(split)
        lo, hi = docs * p // n, docs * (p + 1) // n
        if self.style == "packed":
            return _SplitView(tokens, index[lo:hi], 0, 0, learned)
        longest = int(index[:, 1].max()) - 1  # a document of length L gives L - 1 (input, target) pairs
        if self.block_size > longest:
            raise DataError(
                f"block_size {self.block_size} is longer than every document of {self.name!r} ({split!r} split; "
                f"the longest gives {longest} positions), so every padded row would be mostly padding; "
                f"lower block_size to at most {longest} or use the 'pmd' style"
            )
        return _SplitView(tokens, index[lo:hi], 0, 0, learned)

    def fill(
        self,
        rng: np.random.Generator,
        rows: np.ndarray,
        split: str,
        x: np.ndarray,
        y: np.ndarray,
        mask: np.ndarray,
    ) -> None:
        """Write rows ``rows`` of ``x``, ``y``, ``padding_mask`` (drawing with ``rng``)."""
        if rows.size == 0:
            return
        view = self.view(split)
        tokens = view.tokens
        t = self.block_size
        if self.style == "pmd":
            starts = rng.integers(view.lo, view.hi - t - 1, size=rows.size, endpoint=True)
            for r, s in zip(rows.tolist(), starts.tolist(), strict=True):
                window = tokens[s : s + t + 1]
                x[r] = window[:-1]
                y[r] = window[1:]
            mask[rows] = True
            return
        x[rows] = self.pad_id
        y[rows] = -1
        mask[rows] = 0
        if self.style == "packed":
            self._pack(rng, rows, view, x, y, mask)
            return
        picks = rng.integers(0, view.index.shape[0], size=rows.size)
        for r, (start, length, prompt) in zip(rows.tolist(), view.index[picks].tolist(), strict=True):
            n = min(length, t + 1) - 1
            x[r, :n], y[r, :n] = self._example(view, start, n, prompt)
            mask[r, :n] = True

    def _example(self, view: _SplitView, start: int, n: int, prompt: int) -> tuple[np.ndarray, np.ndarray]:
        """Inputs and targets of the first ``n`` positions of the document at ``start``."""
        doc = view.tokens[start : start + n + 1]
        targets = doc[1:].astype(np.int32)
        if view.learned is not None:
            targets[view.learned[start + 1 : start + n + 1] == 0] = -1
        elif prompt > 1:
            targets[: min(prompt - 1, n)] = -1
        return doc[:-1], targets

    def _pack(
        self,
        rng: np.random.Generator,
        rows: np.ndarray,
        view: _SplitView,
        x: np.ndarray,
        y: np.ndarray,
        mask: np.ndarray,
    ) -> None:
        """First-fit documents into ``rows``; ``mask`` gets segment ids 1, 2, ... (0 = padding).

        Documents are drawn one at a time and placed in the first row with room; a document longer
        than a row is cut to the row. Drawing stops when every row is full or ``PACK_MISSES`` draws
        found no room (an empty row always has room, so every row holds at least one example).
        """
        t = self.block_size
        free = np.full(rows.size, t, dtype=np.int64)
        segments = np.zeros(rows.size, dtype=np.int64)
        documents = view.index.shape[0]
        misses = 0
        while misses < PACK_MISSES and int(free.max()) > 0:
            start, length, prompt = view.index[int(rng.integers(0, documents))].tolist()
            n = min(length, t + 1) - 1
            room = np.flatnonzero(free >= n) if n > 0 else np.empty(0, dtype=np.int64)
            if room.size == 0:
                misses += 1
                continue
            j = int(room[0])
            r, at = int(rows[j]), int(t - free[j])
            x[r, at : at + n], y[r, at : at + n] = self._example(view, start, n, prompt)
            segments[j] += 1
            mask[r, at : at + n] = segments[j]
            free[j] -= n
