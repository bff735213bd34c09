"""``PredictionEntropy``: how uncertain the model is at each position of a sequence."""

from __future__ import annotations

import csv
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import jax
import numpy as np

from theseus.analysis import Analysis
from theseus.config import field


def entropy_by_position(logits: Any, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean predictive entropy (nats) per position over the rows where the position counts, and the
    number of such rows."""
    z = np.asarray(logits, np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=-1, keepdims=True)
    entropy = -(p * np.log(np.maximum(p, 1e-300))).sum(axis=-1)
    rows = valid.sum(axis=0)
    mean = np.where(rows > 0, (entropy * valid).sum(axis=0) / np.maximum(rows, 1), np.nan)
    return mean, rows


@dataclass
class PredictionEntropy(Analysis):
    """The entropy of the next-token distribution at each position of one batch of ``split``.

    Runs the trainer's ``trace()`` (so a trainer that makes its trace deterministic gets a
    reproducible analysis) and writes ``<run dir>/analysis/entropy/step_<N>.csv`` with one row per
    position: ``position, entropy, rows``. Early positions have little context, so their entropy
    is higher; returns the mean entropy and the trace's loss for the metrics.
    """

    name: ClassVar[str] = "entropy"

    split: str = field("analysis/entropy/split", default="val", help="data split of the analysed batch")

    def analyze(self, trainer: Any, state: Any, step: int, out_dir: Path) -> Mapping[str, float] | None:
        host = trainer.host_batch(self.split, position=0)
        batch = trainer.sharding.put_batch(host)
        logits, loss, _meta = trainer.trace_fn()(state, batch, trainer.step_key(step))
        valid = np.asarray(host["y"]) != -1
        if "padding_mask" in host:
            valid &= np.asarray(host["padding_mask"], bool)
        mean, rows = entropy_by_position(jax.device_get(logits), valid)
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / f"step_{step:08d}.csv"
        tmp = path.with_suffix(".csv.tmp")
        with tmp.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(["position", "entropy", "rows"])
            for position, (value, count) in enumerate(zip(mean, rows, strict=True)):
                writer.writerow([position, "" if count == 0 else f"{value:.6f}", int(count)])
        tmp.replace(path)
        counted = rows > 0
        return {
            "mean": float(np.sum(mean[counted] * rows[counted]) / max(int(rows.sum()), 1)),
            "first": float(mean[counted][0]) if counted.any() else float("nan"),
            "last": float(mean[counted][-1]) if counted.any() else float("nan"),
            "loss": float(np.asarray(loss)),
        }
