"""A job file for ``theseus --load``: the tiny model on prepared byte data with injectable NaN/inf, and a
job whose configuration classes disagree on a default."""

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import jax
import jax.numpy as jnp
import numpy as np

from tests.training.tiny import TinyLM
from theseus.base.job import Job
from theseus.config import field
from theseus.registry import job
from theseus.training.base import BaseTrainer, BaseTrainerConfig
from theseus.training.flywheel.strategy import Sampling


@dataclass
class PoisonConfig(BaseTrainerConfig):
    poison_step: int = field("test/poison_step", default=0, help="1-based update made non-finite (0 = none)")
    poison: str = field("test/poison", default="loss", help="what becomes NaN: loss or grad")


@jax.custom_vjp
def scale_gradient(x: jax.Array, factor: jax.Array) -> jax.Array:
    """Identity whose gradient is multiplied by ``1 + factor`` (NaN factor: NaN gradient, finite value)."""
    return x


def _forward(x: jax.Array, factor: jax.Array) -> tuple[jax.Array, jax.Array]:
    return x, factor


def _backward(factor: jax.Array, g: jax.Array) -> tuple[jax.Array, jax.Array]:
    return g * (1.0 + factor), jnp.zeros_like(factor)


scale_gradient.defvjp(_forward, _backward)


@job("test/reliability/train")
class PoisonedTrainer(BaseTrainer):
    """Update ``test/poison_step`` gets a NaN loss (``test/poison=loss``) or a NaN gradient (``grad``)."""

    CONFIG = PoisonConfig
    MODEL = TinyLM
    DATASET = [Sampling("corpus", 1.0, "pmd")]

    def batch(self, slice: str = "train") -> dict[str, Any]:
        batch = dict(super().batch(slice))
        hit = slice == "train" and self.position(slice) + 1 == self.args.poison_step
        for kind in ("loss", "grad"):
            value = np.nan if hit and self.args.poison == kind else 0.0
            batch[f"poison_{kind}"] = np.full(batch["x"].shape, value, np.float32)
        return batch

    @staticmethod
    def forward(
        state: Any, params: Any, batch: Any, key: Any = None, deterministic: bool = False, intermediates: bool = False
    ) -> Any:
        logits, loss, meta = BaseTrainer.forward(state, params, batch, key, deterministic, intermediates)
        if loss is not None and "poison_loss" in batch:
            loss = scale_gradient(loss + jnp.sum(batch["poison_loss"]), jnp.sum(batch["poison_grad"]))
        return logits, loss, meta


@dataclass
class SizeA:
    size: int = field("shared/size", default=8)


@dataclass
class SizeB:
    size: int = field("shared/size", default=16)


@job("test/reliability/conflict")
class Conflicting(Job):
    """Two configuration classes give ``shared/size`` different defaults."""

    CONFIG = SizeA

    @classmethod
    def config(cls) -> list[type]:
        return [SizeA, SizeB]

    def run(self) -> None:
        raise AssertionError("never reached: the configuration cannot be built")
