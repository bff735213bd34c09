"""Padding-free scoring: the rows of a batch packed into as few rows as hold them, kept apart by segment ids.

A batch of right-padded rows (``x``, ``y``, ``padding_mask``, ``[B, T]``) may also carry the same examples
packed (:func:`pack`): ``packed_x`` and ``packed_y`` ``[P, T]``, int32 ``packed_segments`` (1, 2, ... per
example of a row, 0 on padding; the model then attends within each example and restarts its positions at
each one) and ``packed_index`` ``[B, T]``, where each position of a padded row lies in the packed rows
flattened (-1: padding). A model pass reads the packed rows (:func:`model_rows`) and its per-position
scores are gathered back to the padded layout (:func:`unpack`), so whatever reads them (a loss, a metric)
is unchanged; only the pass's work shrinks, to ``P`` rows of ``B``.

Packing is first-fit decreasing. ``P`` is rounded up to a step (``1 / buckets`` of the rows, a multiple of
the data-parallel devices) so that a run compiles its passes for a few row counts, not one per batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, overload

import jax
import jax.numpy as jnp
import numpy as np

PACKED_X, PACKED_Y, PACKED_SEGMENTS, PACKED_INDEX = "packed_x", "packed_y", "packed_segments", "packed_index"
#: The batch entries whose rows are packed rows (``[P, T]``); ``packed_index`` has the batch's rows.
PACKED_ROWS = (PACKED_X, PACKED_Y, PACKED_SEGMENTS)
#: How many row counts the packed rows of a batch of ``B`` rows come in at most (multiples of ``B / buckets``).
BUCKETS = 8


@dataclass(frozen=True)
class Packed:
    """A batch's packed rows (``entries``: :data:`PACKED_ROWS` and :data:`PACKED_INDEX`), how many rows
    they are and ``fill``, the share of their positions real tokens take."""

    entries: dict[str, np.ndarray]
    rows: int
    fill: float


def first_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Indices of ``lengths`` in bins of at most ``capacity``: longest first, each into the first bin it fits,
    each bin's indices in ascending order."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        if lengths[i] > capacity:
            raise ValueError(f"an example of {lengths[i]} tokens does not fit a row of {capacity}")
        fit = next((b for b, left in enumerate(room) if left >= lengths[i]), None)
        if fit is None:
            bins.append([])
            room.append(capacity)
            fit = len(bins) - 1
        bins[fit].append(i)
        room[fit] -= lengths[i]
    return [sorted(b) for b in bins]


def packed_row_count(needed: int, rows: int, multiple: int = 1, buckets: int = BUCKETS) -> int:
    """``needed`` packed rows rounded up to a step of ``rows / buckets`` that is a multiple of ``multiple``,
    at most ``rows`` (which ``multiple`` divides)."""
    step = -(-max(1, -(-rows // buckets)) // multiple) * multiple
    return min(rows, -(-max(needed, 1) // step) * step)


def pack(batch: Mapping[str, np.ndarray], *, shares: int = 1, multiple: int = 1, buckets: int = BUCKETS) -> Packed:
    """The packed rows of ``batch``'s right-padded rows (``x``, ``y``, ``padding_mask`` ``[B, T]``). The rows
    split into ``shares`` contiguous shares (the processes that feed them, in order), each packed apart into
    the same number of rows, a multiple of ``multiple`` (the data-parallel devices a share feeds); the
    packed rows of share ``k`` come ``k``-th, and ``packed_index`` counts over all of them."""
    x, y, real = np.asarray(batch["x"]), np.asarray(batch["y"]), np.asarray(batch["padding_mask"]).astype(bool)
    rows, width = x.shape
    if rows % shares or (rows // shares) % multiple:
        raise ValueError(f"{rows} rows do not split into {shares} shares of a multiple of {multiple} rows")
    lengths = real.sum(axis=1)
    if not all(real[i, : lengths[i]].all() for i in range(rows)):
        raise ValueError("packing takes right-padded rows: each row's tokens from position 0, padding after them")
    per = rows // shares
    placed = [first_fit_decreasing(lengths[s * per : (s + 1) * per].tolist(), width) for s in range(shares)]
    count = packed_row_count(max(len(bins) for bins in placed), per, multiple, buckets)
    px = np.zeros((shares * count, width), np.int32)
    py = np.full((shares * count, width), -1, np.int32)
    segments = np.zeros((shares * count, width), np.int32)
    index = np.full((rows, width), -1, np.int32)
    for s, bins in enumerate(placed):
        for b, members in enumerate(bins):
            row, at = s * count + b, 0
            for k, i in enumerate(members, start=1):
                source, n = s * per + i, int(lengths[s * per + i])
                px[row, at : at + n], py[row, at : at + n] = x[source, :n], y[source, :n]
                segments[row, at : at + n] = k
                index[source, :n] = row * width + at + np.arange(n)
                at += n
    entries = {PACKED_X: px, PACKED_Y: py, PACKED_SEGMENTS: segments, PACKED_INDEX: index}
    return Packed(entries, shares * count, float(lengths.sum()) / max(px.size, 1))


def is_packed(batch: Mapping[str, Any]) -> bool:
    """Whether ``batch`` carries packed rows."""
    return PACKED_INDEX in batch


def model_rows(batch: Mapping[str, Any]) -> dict[str, Any]:
    """What a model pass reads (``x``, ``y``, ``padding_mask``): the packed rows, with their segment ids as the
    padding mask, when ``batch`` carries them, else its own rows."""
    if is_packed(batch):
        return {"x": batch[PACKED_X], "y": batch[PACKED_Y], "padding_mask": batch[PACKED_SEGMENTS]}
    return {"x": batch["x"], "y": batch.get("y"), "padding_mask": batch.get("padding_mask")}


@overload
def unpack(values: jax.Array, batch: Mapping[str, Any]) -> jax.Array: ...
@overload
def unpack(values: None, batch: Mapping[str, Any]) -> None: ...
def unpack(values: jax.Array | None, batch: Mapping[str, Any]) -> jax.Array | None:
    """Per-position ``values`` of :func:`model_rows` (``[P, T]``) in ``batch``'s own rows (``[B, T]``, 0 on
    padding); ``values`` as they are when the batch is not packed."""
    if values is None or not is_packed(batch):
        return values
    index = jnp.asarray(batch[PACKED_INDEX])
    picked = jnp.take(jnp.reshape(values, (-1,)), jnp.maximum(index, 0), axis=0)
    return jnp.where(index >= 0, picked, jnp.zeros((), values.dtype))


def share(batch: Mapping[str, np.ndarray], index: int, count: int) -> dict[str, np.ndarray]:
    """Share ``index`` of ``count`` of a batch every process holds whole: its contiguous rows, and its packed
    rows where the batch carries them (``packed_index`` keeps counting over every share's packed rows)."""
    out = {}
    for name, value in batch.items():
        per = len(value) // count
        out[name] = value[index * per : (index + 1) * per]
    return out


__all__ = [
    "BUCKETS",
    "PACKED_INDEX",
    "PACKED_ROWS",
    "PACKED_SEGMENTS",
    "PACKED_X",
    "PACKED_Y",
    "Packed",
    "first_fit_decreasing",
    "is_packed",
    "model_rows",
    "pack",
    "packed_row_count",
    "share",
]
