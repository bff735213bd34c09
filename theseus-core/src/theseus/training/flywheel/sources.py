"""One prepared dataset read in one style: how rows of a batch are cut from its shards.

A style is two steps, so that the rows of a global batch never depend on who reads them:

* ``draw(rng, split, count)`` draws one integer per row of the *global* batch (every process
  draws the same numbers, for all rows);
* ``fill(picks, rows, split, x, y, mask)`` writes the rows this process feeds from their picks.

Styles:

* ``"pmd"``: a pick is the first token of a window of ``block_size + 1`` tokens anywhere in the split;
* ``"padded"``: a pick is a document of the split, one per row, padded (or cut) to ``block_size``.

A new style adds a branch to ``draw`` (what one integer per row means) and to ``fill`` (how a row
is cut from it), and its name to ``STYLES`` in ``theseus.data.format`` and
``theseus.training.flywheel.strategy``. A style that needs more randomness per row can draw a
per-row seed and build a generator from it in ``fill``.
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


class Source:
    """Rows from one prepared dataset, in ``"pmd"`` or ``"padded"`` style."""

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
        longest = int(index[:, 1].max()) - 1  # a document of length L gives L - 1 (input, target) pairs
        if self.block_size > longest:
            raise DataError(
                f"block_size {self.block_size} is longer than every document of {self.name!r} ({split!r} split; "
                f"the longest gives {longest} positions), so every padded row would be mostly padding; "
                f"lower block_size to at most {longest} or use the 'pmd' style"
            )
        return _SplitView(tokens, index)

    def draw(self, rng: np.random.Generator, split: str, count: int) -> np.ndarray:
        """One pick per row of the global batch: a window start (``pmd``) or a document (``padded``)."""
        view = self.view(split)
        if self.style == "pmd":
            return rng.integers(0, view.tokens.size - self.block_size - 1, size=count, endpoint=True)
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
        mask[rows] = False
        for r, (start, length, prompt) in zip(rows.tolist(), view.index[picks].tolist(), strict=True):
            n = min(length, t + 1) - 1
            doc = tokens[start : start + n + 1]
            x[r, :n] = doc[:-1]
            y[r, :n] = doc[1:]
            if prompt > 1:
                y[r, : min(prompt - 1, n)] = -1
            mask[r, :n] = True
