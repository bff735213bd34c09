"""``NextTokenAccuracy``: how often the model's most likely next token is the right one."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from theseus.config import field
from theseus.errors import ConfigError
from theseus.evaluation import Evaluation


def accuracy_counts(logits: jax.Array, batch: Mapping[str, Any]) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(top-1 hits, top-5 hits, counted targets)``: targets with ``y != -1`` that are not padding."""
    y = batch["y"]
    valid = y != -1
    if batch.get("padding_mask") is not None:
        valid = valid & batch["padding_mask"]
    hits = (jnp.argmax(logits, axis=-1) == y) & valid
    top5 = jax.lax.top_k(logits, min(5, logits.shape[-1]))[1]
    hits5 = jnp.any(top5 == y[..., None], axis=-1) & valid
    return jnp.sum(hits), jnp.sum(hits5), jnp.sum(valid)


@dataclass
class NextTokenAccuracy(Evaluation):
    """Top-1 and top-5 next-token accuracy over ``batches`` batches of ``split``, without dropout.

    It calls the trainer's ``forward()`` and reads batches through ``batch()``, so a trainer's
    changes to either (e.g. targets set to -1) are measured too. Logged as ``next_token/accuracy``,
    ``next_token/top5`` and ``next_token/targets`` in ``eval`` records.
    """

    name: ClassVar[str] = "next_token"

    split: str = field("evaluation/next_token/split", default="val", help="data split to measure")
    batches: int = field("evaluation/next_token/batches", default=4, help="number of batches")

    def evaluate(self, trainer: Any, state: Any) -> Mapping[str, float]:
        if self.batches < 1:
            raise ConfigError(f"evaluation/next_token/batches must be at least 1, got {self.batches}")
        cls, sharding = type(trainer), trainer.sharding

        def counts(state: Any, batch: Mapping[str, Any]) -> tuple[jax.Array, jax.Array, jax.Array]:
            with sharding.context():
                logits, _loss, _meta = cls.forward(state, state.params, batch, deterministic=True)
            return accuracy_counts(logits, batch)

        fn = trainer.compiled("example/next_token", lambda: jax.jit(counts))
        totals = np.zeros(3, np.int64)
        for index in range(self.batches):
            batch = trainer.sharding.put_batch(trainer.host_batch(self.split, position=index))
            totals += np.asarray(jax.device_get(fn(state, batch)), np.int64)
        hits, hits5, count = (int(v) for v in totals)
        return {
            "accuracy": hits / count if count else float("nan"),
            "top5": hits5 / count if count else float("nan"),
            "targets": count,
        }
