"""Per-layer activation statistics (mean, std, RMS, max |x|) as JSON and a PNG plot."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from theseus.analysis.base import Analysis
from theseus.config import field
from theseus.errors import TrainingError
from theseus.files import replace_file
from theseus.tracking.plots import figure

if TYPE_CHECKING:
    from theseus.training.base import BaseTrainer


def layer_name(path: tuple[str, ...]) -> str:
    """``('Block_0', 'mlp', '__call__', '0')`` -> ``'Block_0/mlp'`` (the model's own output: ``'model'``)."""
    parts = [p for p in path if p != "__call__" and not p.isdigit()]
    return "/".join(parts) or "model"


def activation_table(outputs: Sequence[tuple[tuple[str, ...], Any]]) -> list[dict[str, Any]]:
    """One row per recorded floating-point output with at least one dimension, in the given order."""
    rows: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for path, value in outputs:
        array = np.asarray(value)
        if array.ndim == 0 or array.dtype.kind != "f":
            continue
        values = array.astype(np.float64)
        name = layer_name(path)
        count = seen.get(name, 0)
        seen[name] = count + 1
        rows.append(
            {
                "name": name if count == 0 else f"{name}#{count}",
                "shape": list(array.shape),
                "dtype": str(array.dtype),
                "mean": float(values.mean()),
                "std": float(values.std()),
                "rms": float(np.sqrt(np.mean(values**2))),
                "max_abs": float(np.max(np.abs(values))),
                "nonfinite": int(np.size(values) - np.isfinite(values).sum()),
            }
        )
    return rows


def plot_table(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    names = [r["name"] for r in rows]
    positions = np.arange(len(rows))
    with figure(path, figsize=(max(6.0, 0.35 * len(rows) + 2), 4.5)) as ax:
        ax.plot(positions, [r["rms"] for r in rows], "o-", label="rms")
        ax.plot(positions, [r["std"] for r in rows], "s--", label="std", alpha=0.7)
        ax.plot(positions, [r["max_abs"] for r in rows], "^:", label="max |x|", alpha=0.7)
        ax.set_yscale("symlog", linthresh=1e-3)
        ax.set_xticks(positions)
        ax.set_xticklabels(names, rotation=70, ha="right", fontsize=7)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()


@dataclass
class ActivationStatistics(Analysis):
    """Statistics of every module's output on one batch, in execution order."""

    name: ClassVar[str] = "activations"

    split: str = field("analysis/activations/split", default="val", help="data split of the analysed batch")
    plot: bool = field("analysis/activations/plot", default=True, help="also write a PNG plot")

    def analyze(self, trainer: BaseTrainer, state: Any, step: int, out_dir: Path) -> Mapping[str, float] | None:
        batch = trainer.host_batch(self.split, position=0)
        _outputs, recorded = trainer.capture(state, trainer.sharding.put_batch(batch), trainer.step_key(step))
        rows = activation_table(recorded)
        if not rows:
            raise TrainingError(
                f"{type(trainer).__qualname__}.trace() recorded no module outputs; a custom trace() must call the "
                "model through state.apply_fn"
            )
        out_dir.mkdir(parents=True, exist_ok=True)
        record = {"step": step, "layers": rows}
        replace_file(out_dir / f"step_{step:08d}.json", json.dumps(record, indent=1) + "\n")
        if self.plot:
            plot_table(rows, out_dir / f"step_{step:08d}.png", f"activations at step {step}")
        return {
            "max_rms": max(r["rms"] for r in rows),
            "max_abs": max(r["max_abs"] for r in rows),
            "nonfinite": sum(r["nonfinite"] for r in rows),
        }
