"""Perplexity on held-out batches of the trainer's data."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from theseus.config import field
from theseus.evaluation.base import Evaluation

if TYPE_CHECKING:
    from theseus.training.base import BaseTrainer


@dataclass
class Perplexity(Evaluation):
    """``exp`` of the targets' mean cross-entropy over ``batches`` batches of ``split`` (whatever the
    trainer's objective: see ``BaseTrainer.validate``)."""

    name: ClassVar[str] = "perplexity"

    split: str = field("evaluation/perplexity/split", default="val", help="data split to measure")
    batches: int = field("evaluation/perplexity/batches", default=8, help="number of batches")

    def evaluate(self, trainer: BaseTrainer, state: Any) -> Mapping[str, float]:
        result = trainer.validate(state, batches=self.batches, slice=self.split)
        loss = result["loss"]
        return {"loss": loss, "perplexity": math.exp(min(loss, 700.0)), "targets": result["targets"]}
