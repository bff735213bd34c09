"""Scoring rows of tokens with the trainer's model: the summed log-probability of chosen targets."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from theseus.training.base import BaseTrainer

#: One row: inputs ``x``, targets ``y`` (-1 = not scored) and the padding mask, each ``[sequence_length]``.
Row = tuple[np.ndarray, np.ndarray, np.ndarray]


def score_rows(trainer: BaseTrainer, state: Any, rows: Sequence[Row]) -> tuple[np.ndarray, np.ndarray]:
    """Summed target log-probabilities (natural log) and target counts of each row, computed
    ``trainer.eval_rows`` rows at a time."""
    width = trainer.eval_rows
    fn = _scorer(trainer)
    loglik, counts = [], []
    for start in range(0, len(rows), width):
        chunk = list(rows[start : start + width])
        real = len(chunk)
        while len(chunk) < width:
            chunk.append(chunk[-1])
        batch = {
            "x": np.stack([r[0] for r in chunk]),
            "y": np.stack([r[1] for r in chunk]),
            "padding_mask": np.stack([r[2] for r in chunk]),
        }
        ll, n = trainer.sharding.fetch(fn(state, trainer.sharding.put_global(batch)))
        loglik.append(np.asarray(ll)[:real])
        counts.append(np.asarray(n)[:real])
    return np.concatenate(loglik), np.concatenate(counts)


def _scorer(trainer: BaseTrainer) -> Any:
    import jax

    from theseus.base.logprobs import sequence_logps

    cls = type(trainer)
    sharding = trainer.sharding

    def score(state: Any, batch: Mapping[str, Any]) -> tuple[Any, Any]:
        with sharding.context():
            logits, _loss, _meta = cls.forward(state, state.params, batch, key=None, deterministic=True)
        return sequence_logps(logits, batch["y"], batch["padding_mask"])

    return trainer.compiled("row_score", lambda: jax.jit(score))
