"""The reference model of preference tuning: its log-probabilities per sequence, computed beside
the policy or once per run and kept in the run folder (``reference/<split>.npy``)."""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from theseus.base import jsonfile
from theseus.files import replace_file
from theseus.training import steps
from theseus.training.flywheel.sources import Source
from theseus.training.sharding import TrainerSharding

#: The folder of a run that holds precomputed reference log-probabilities.
REFERENCE_DIR = "reference"
MANIFEST = "manifest.json"
MODEL_KEYS = ("x", "y", "padding_mask")


def reference_fn(model: Any, sharding: TrainerSharding, *, leading: bool) -> Any:
    """``fn(params, batch) -> summed log-probabilities per row``, jitted, without dropout.

    With ``leading`` the batch is arranged ``[micro-batches, rows, ...]`` (a training batch) and the
    micro-batches are computed one after the other.
    """

    call = steps.ModelCall(model, model.apply)

    def one(params: Any, micro: Mapping[str, Any]) -> jax.Array:
        with sharding.context():  # a chunk of logits at a time where the model can (model/loss_chunk)
            logps = steps.target_scores(call, params, micro, deterministic=True)[1]
        return jnp.sum(logps, axis=-1)

    def logps(params: Any, batch: Mapping[str, Any]) -> jax.Array:
        inputs = {k: batch[k] for k in MODEL_KEYS if k in batch}
        if leading:
            return jax.lax.map(lambda micro: one(params, micro), inputs)
        return one(params, inputs)

    return jax.jit(logps)


def manifest(source: Source, splits: tuple[str, ...], init_from: str) -> dict[str, Any]:
    """What the stored values depend on: the data (documents and tokens per split), row length, base."""
    return {
        "dataset": source.name,
        "documents": {split: int(source.view(split).index.shape[0]) for split in splits},
        "tokens": {split: int(source.view(split).tokens.size) for split in splits},
        "sequence_length": source.block_size,
        "init_from": init_from,
    }


def load_table(folder: Path, expected: Mapping[str, Any]) -> dict[str, np.ndarray] | None:
    """The stored log-probabilities when they were computed for ``expected``, else None."""
    try:
        found = jsonfile.read(folder / MANIFEST)
    except jsonfile.UnreadableJSON:  # missing, damaged or hostile: computed again
        return None
    if found != dict(expected):
        return None
    table = {}
    for split, count in expected["documents"].items():
        path = folder / f"{split}.npy"
        if not path.is_file():
            return None
        values = np.load(path, allow_pickle=False)
        if values.shape != (count,):
            return None
        table[split] = values
    return table


def save_table(folder: Path, table: Mapping[str, np.ndarray], description: Mapping[str, Any]) -> None:
    """Write the values, then the manifest that makes them count (a partial write is recomputed)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MANIFEST).unlink(missing_ok=True)
    for split, values in table.items():
        buffer = io.BytesIO()
        np.save(buffer, np.asarray(values, np.float32))
        replace_file(folder / f"{split}.npy", buffer.getvalue())
    replace_file(folder / MANIFEST, json.dumps(dict(description), indent=2) + "\n")


def compute_table(fn: Any, params: Any, source: Source, split: str, rows: int, sharding: TrainerSharding) -> np.ndarray:
    """The reference log-probability of every document of ``split``, ``rows`` documents per pass."""
    count = int(source.view(split).index.shape[0])
    t = source.block_size
    dtype = bool
    parts = []
    for start in range(0, count, rows):
        picks = np.arange(start, start + rows) % count  # the last pass is filled up with repeats
        x = np.empty((rows, t), np.int32)
        y = np.empty((rows, t), np.int32)
        mask = np.empty((rows, t), dtype)
        source.fill(picks, np.arange(rows), split, x, y, mask)
        parts.append(fn(params, sharding.put_global({"x": x, "y": y, "padding_mask": mask})))
    values = np.concatenate([np.asarray(p) for p in sharding.fetch(parts)])
    return values[:count].astype(np.float32)


__all__ = ["REFERENCE_DIR", "compute_table", "load_table", "manifest", "reference_fn", "save_table"]
