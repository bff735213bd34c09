"""``RewardTrainer`` (``train/reward``): a Bradley-Terry reward model on preference pairs.

The model is the selected language model (``model=``, or the one ``training/init_from`` holds) with a
scalar head on the last non-padding token (:mod:`theseus.model.reward.head`); its own parameters start
from ``training/init_from`` and the head fresh. It reads the data ``train/dpo`` reads
(``dataset/preference``, ``"pairs"`` style) and minimises :class:`~theseus.model.reward.loss.BradleyTerry`
with every layout, resume and preemption of fine-tuning. The whole model trains: LoRA adapters would
leave the head frozen, so ``model/lora/rank`` above 0 is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import jax

from theseus.config import field
from theseus.errors import ConfigError
from theseus.model.finetune.dpo import check_pairs
from theseus.model.finetune.trainer import SFTConfig, SFTTrainer
from theseus.model.layers._common import INIT_STD
from theseus.model.reward.head import HEAD, scored
from theseus.model.reward.loss import BradleyTerry
from theseus.training.flywheel.strategy import Sampling
from theseus.training.state import TrainState


@dataclass
class RewardModelConfig(SFTConfig):
    """The reward model's objective; its language model starts from ``training/init_from``."""

    center_coefficient: float = field(
        "reward_model/center_coefficient",
        default=0.0,
        min=0.0,
        help="weight of mean((r_chosen + r_rejected)^2), keeping rewards near 0 (TRL's center_rewards_coefficient)",
    )


class RewardTrainer(SFTTrainer):
    """A reward model trained on ``dataset/preference`` pairs; subclass it to change the model or the data."""

    CONFIG: ClassVar[type] = RewardModelConfig
    DATASET: ClassVar[Any] = Sampling("preference", 1.0, "pairs")
    OBJECTIVE: ClassVar[Any] = BradleyTerry  # built from reward_model/* (BradleyTerry.for_trainer)
    PLOTTED: ClassVar[Any] = ("accuracy",)

    def model_class(self) -> type:
        """The selected language model with the scalar reward head."""
        return scored(super().model_class())

    def setup(self) -> None:
        if self._ready:
            return
        if self.lora_rank > 0:
            raise ConfigError(
                f"model/lora/rank={self.lora_rank}: train/reward trains the whole model with its reward head "
                "(adapters would leave the head frozen); set model/lora/rank=0"
            )
        super().setup()
        check_pairs(self)

    def load_base(self, source: Any, abstract: Any, shardings: Any) -> Any:
        """The language model's parameters from ``training/init_from`` and a fresh reward head."""
        base_abstract = {k: v for k, v in abstract.items() if k != HEAD}
        base_shardings = {k: v for k, v in shardings.items() if k != HEAD}
        params = dict(super().load_base(source, base_abstract, base_shardings))
        shape, dtype = abstract[HEAD].shape, abstract[HEAD].dtype
        key = jax.random.fold_in(self.init_key, 1)

        def fresh() -> jax.Array:
            return (jax.random.normal(key, shape, jax.numpy.float32) * INIT_STD).astype(dtype)

        params[HEAD] = jax.jit(fresh, out_shardings=shardings[HEAD])()
        return params

    def validate(self, state: TrainState, batches: int | None = None, slice: str = "val") -> dict[str, Any]:
        result = super().validate(state, batches, slice)
        result["pairs"] = result.pop("targets")
        return result


__all__ = ["RewardModelConfig", "RewardTrainer"]
