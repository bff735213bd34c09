"""The Bradley-Terry loss of a reward model on preference pairs, with TRL's ``RewardTrainer`` definitions.

Rows come in pairs (``"pairs"`` style: row ``2j`` chosen, ``2j + 1`` rejected); with ``r_c`` and
``r_r`` the rewards of a pair, the loss is the mean over pairs of ``-log sigmoid(r_c - r_r - m)``
(``m`` a per-pair margin, 0 without one) plus ``c · mean((r_c + r_r)²)`` with the centring
coefficient ``c`` (TRL's ``center_rewards_coefficient``; 0: off). Metrics carry TRL's names:
``accuracy`` (the share of pairs with ``r_c > r_r``) and ``margin`` (the mean of ``r_c - r_r``), with
the mean rewards ``rewards/chosen`` and ``rewards/rejected`` beside them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from theseus.errors import ConfigError
from theseus.model.finetune.preference import pairs_of
from theseus.training.objective import Batch, Metrics, Needs, Objective, Scores


def bradley_terry(
    chosen: jax.Array, rejected: jax.Array, margin: jax.Array | None = None, center_coefficient: float = 0.0
) -> tuple[jax.Array, Metrics]:
    """``(loss, metrics)`` of per-pair rewards ``chosen`` and ``rejected`` (``[P]``)."""
    difference = chosen - rejected
    shifted = difference if margin is None else difference - margin
    loss = -jnp.mean(jax.nn.log_sigmoid(shifted))
    if center_coefficient:
        loss = loss + center_coefficient * jnp.mean((chosen + rejected) ** 2)
    chosen, rejected, difference = jax.lax.stop_gradient((chosen, rejected, difference))
    metrics = {
        "accuracy": jnp.mean((chosen > rejected).astype(jnp.float32)),
        "margin": jnp.mean(difference),
        "rewards/chosen": jnp.mean(chosen),
        "rewards/rejected": jnp.mean(rejected),
    }
    return loss, metrics


@dataclass(frozen=True)
class BradleyTerry(Objective):
    """The reward model's objective: :func:`bradley_terry` on the rewards of the pairs of a micro-batch."""

    center_coefficient: float = 0.0

    selectable: ClassVar[bool] = False

    @classmethod
    def for_trainer(cls, trainer: Any) -> BradleyTerry:
        """The objective of the trainer's ``reward_model/center_coefficient``."""
        return cls(float(trainer.args.center_coefficient))

    def __post_init__(self) -> None:
        if not self.center_coefficient >= 0:
            raise ConfigError(f"reward_model/center_coefficient must be at least 0, got {self.center_coefficient!r}")

    @property
    def needs(self) -> Needs:
        """One reward per row, from the model's ``rewards`` method."""
        return Needs("rewards")

    def __call__(self, scores: Scores, batch: Batch) -> tuple[jax.Array, Metrics]:
        chosen, rejected = pairs_of(scores.rewards)
        return bradley_terry(chosen, rejected, None, self.center_coefficient)

    def weight_of(self, batch: Batch) -> jax.Array:
        """A micro-batch weighs its number of pairs (the loss is a mean over pairs)."""
        return jnp.asarray(batch["x"].shape[0] // 2, jnp.float32)


__all__ = ["BradleyTerry", "bradley_terry"]
