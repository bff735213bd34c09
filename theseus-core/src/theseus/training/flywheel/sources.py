"""One prepared dataset read in one style: how rows of a batch are cut from its shards.

A style is two steps, so that the rows of a global batch never depend on who reads them:

* ``draw(rng, split, count)`` draws one integer per row of the *global* batch (every process
  draws the same numbers, for all rows);
* ``fill(picks, rows, split, x, y, mask)`` writes the rows this process feeds from their picks.

Styles:

* ``"pmd"``: a pick is the first token of a window of ``block_size + 1`` tokens anywhere in the split;
* ``"padded"``: a pick is a document of the split, one per row, padded (or cut) to ``block_size``;
* ``"packed"``: a pick is a per-row seed; ``fill`` draws documents from it and places them one after
  the other into the row while they fit (``PACK_MISSES`` draws that do not fit end the row). The
  padding mask holds segment ids (1, 2, ... per example, 0 on padding) so that attention stays
  within an example and positions restart per example;
* ``"pairs"``: data prepared as pairs of documents (``2p``, ``2p + 1``: preference data's chosen and
  rejected responses); rows ``2j`` and ``2j + 1`` hold the two documents of one drawn pair, each
  padded (or cut) to ``block_size`` as in ``"padded"``. A pick is the document index.

Targets that are not learned (prompts, non-assistant chat turns) are ``-1``: from the per-token
mask stored with the tokens when the data has one, else from each document's prompt length.

A new style adds a branch to ``draw`` (what one integer per row means) and to ``fill`` (how a row
is cut from it), and its name to ``STYLES`` in ``theseus.data.format`` and
``theseus.training.flywheel.strategy``. A style that needs more randomness per row draws a
per-row seed and builds a generator from it in ``fill``, as ``"packed"`` does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from theseus.data.format import Prepared, prepare_command
from theseus.errors import DataError


@dataclass(frozen=True)
class _SplitView:
    tokens: np.ndarray
    index: np.ndarray  # (start, length, prompt_length) of every document
    learned: np.ndarray | None = None  # per-token "learned as a target" mask, when the data has one


#: A packed row stops drawing documents after this many draws that did not fit.
PACK_MISSES = 16


class Source:
    """Rows from one prepared dataset, in ``"pmd"``, ``"padded"``, ``"packed"`` or ``"pairs"`` style."""

    def __init__(
        self,
        prepared: Prepared,
        style: str,
        *,
        label: str,
        dataset_key: str,
        root: str,
        block_size: int,
    ) -> None:
        self.prepared = prepared
        self.style = style
        self.label = label
        self.dataset_key = dataset_key
        self.root = root
        self.block_size = block_size
        self.pad_id = prepared.header.eot_id
        self._views: dict[str, _SplitView] = {}

    @property
    def name(self) -> str:
        return self.prepared.name

    def _fix(self) -> str:
        return f"{prepare_command(self.name, self.root, self.dataset_key)} data/force=true"

    def view(self, split: str) -> _SplitView:
        """The split's tokens and documents (validated once, then cached)."""
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
        need = self.block_size + 1
        if self.style == "pmd":
            if tokens.size < need:
                raise DataError(
                    f"split {split!r} of dataset {self.name!r} has {tokens.size} tokens, too few for windows of "
                    f"block_size+1={need} tokens; lower block_size or prepare more data: {self._fix()}"
                )
            return _SplitView(tokens, index)
        learned = self.prepared.learned(split)
        if self.style == "packed":
            return _SplitView(tokens, index, learned)
        if self.style == "pairs":
            if index.shape[0] % 2:
                raise DataError(
                    f"split {split!r} of dataset {self.name!r} holds {index.shape[0]} documents, not pairs; the "
                    "'pairs' style reads data prepared as pairs (dataset/preference), or prepare it again: "
                    f"{self._fix()}"
                )
            return _SplitView(tokens, index, learned)
        longest = int(index[:, 1].max()) - 1  # a document of length L gives L - 1 (input, target) pairs
        if self.block_size > longest:
            raise DataError(
                f"block_size {self.block_size} is longer than every document of {self.name!r} ({split!r} split; "
                f"the longest gives {longest} positions), so every padded row would be mostly padding; "
                f"lower block_size to at most {longest} or use the 'pmd' style"
            )
        return _SplitView(tokens, index, learned)

    def draw(self, rng: np.random.Generator, split: str, count: int) -> np.ndarray:
        """One pick per row of the global batch: a window start (``pmd``), a document (``padded``,
        ``pairs``: the two documents of a pair in consecutive rows) or a seed for the row's documents
        (``packed``)."""
        view = self.view(split)
        if self.style == "pmd":
            return rng.integers(0, view.tokens.size - self.block_size - 1, size=count, endpoint=True)
        if self.style == "packed":
            return rng.integers(0, np.iinfo(np.int64).max, size=count, dtype=np.int64)
        if self.style == "pairs":
            pairs = rng.integers(0, view.index.shape[0] // 2, size=(count + 1) // 2)
            return (2 * pairs[:, None] + np.arange(2)).ravel()[:count]
        return rng.integers(0, view.index.shape[0], size=count)

    def fill(
        self,
        picks: np.ndarray,
        rows: np.ndarray,
        split: str,
        x: np.ndarray,
        y: np.ndarray,
        mask: np.ndarray,
    ) -> None:
        """Write rows ``rows`` of ``x``, ``y``, ``padding_mask`` from their ``picks`` (one per row)."""
        if rows.size == 0:
            return
        view = self.view(split)
        tokens = view.tokens
        t = self.block_size
        if self.style == "pmd":
            for r, s in zip(rows.tolist(), picks.tolist(), strict=True):
                window = tokens[s : s + t + 1]
                x[r] = window[:-1]
                y[r] = window[1:]
            mask[rows] = True
            return
        x[rows] = self.pad_id
        y[rows] = -1
        mask[rows] = 0
        if self.style == "packed":
            for r, seed in zip(rows.tolist(), picks.tolist(), strict=True):
                self._pack(np.random.default_rng(seed), r, view, x, y, mask)
            return
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
        r: int,
        view: _SplitView,
        x: np.ndarray,
        y: np.ndarray,
        mask: np.ndarray,
    ) -> None:
        """Fill row ``r`` with documents drawn from ``rng``; ``mask`` gets segment ids 1, 2, ... (0 = padding).

        Documents are drawn one at a time and placed after the previous one when they fit; a
        document longer than the row is cut to the row (it can only be first, so every row holds at
        least one example). Drawing stops when the row is full or ``PACK_MISSES`` draws did not fit.
        The row depends on its seed only, not on which process builds it or on the other rows.
        """
        t = self.block_size
        free = t
        segment = 0
        documents = view.index.shape[0]
        misses = 0
        while misses < PACK_MISSES and free > 0:
            start, length, prompt = view.index[int(rng.integers(0, documents))].tolist()
            n = min(length, t + 1) - 1
            if n <= 0 or n > free:
                misses += 1
                continue
            at = t - free
            x[r, at : at + n], y[r, at : at + n] = self._example(view, start, n, prompt)
            segment += 1
            mask[r, at : at + n] = segment
            free -= n
