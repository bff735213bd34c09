"""``SFTTrainer``: supervised fine-tuning on chat or instruction data, fully or with LoRA adapters.

The trainer reads prepared chat data in the ``"packed"`` style by default (several conversations per
row, kept apart by segment ids, loss on assistant tokens only) and starts from base weights
(``training/init_from``: a run or a Hugging Face checkpoint; else the model's own initialisation).
LoRA and QLoRA (adapters alone trained over a base kept bit for bit, :mod:`theseus.training.adapters`;
a quantized base held out of the update, :mod:`theseus.training.frozen`, and quantized as the source
reads it) are every trainer's; fine-tuning adds the check that ``model/lora/targets`` match the
model's projections and the chat template kept with the run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import optax

from theseus.config import configuration
from theseus.errors import ConfigError
from theseus.files import replace_file
from theseus.model.layers import lora, quantization
from theseus.model.loading.adapters import plain_shapes
from theseus.model.loading.chat import TEMPLATE_FILE
from theseus.runs.layout import run_path
from theseus.training import frozen
from theseus.training.base import BaseTrainer
from theseus.training.config import BaseTrainerConfig
from theseus.training.flywheel.strategy import Sampling
from theseus.training.optimizers import AdamW
from theseus.training.state import TrainState


@dataclass
class SFTConfig(BaseTrainerConfig):
    """Training settings of fine-tuning; the base weights come from ``training/init_from``."""


class SFTTrainer(BaseTrainer):
    """Supervised fine-tuning: packed chat data, loss on assistant tokens, optional LoRA.

    Subclass it to change the model or the data (``DATASET = Sampling("instructions", 1.0, "packed")``).
    """

    CONFIG: ClassVar[type] = SFTConfig
    MODEL: ClassVar[Any] = "gpt"
    DATASET: ClassVar[Any] = Sampling("chat", 1.0, "packed")
    OPTIMIZER: ClassVar[Any] = AdamW
    SCHEDULE: ClassVar[Any] = None
    EVALUATION: ClassVar[Any] = []

    # -- LoRA ----------------------------------------------------------------------------------
    @property
    def lora_rank(self) -> int:
        return int(self.setting("model/lora/rank", 0) or 0)

    def _restrict_optimizer(self, tx: optax.GradientTransformation, params: Any) -> optax.GradientTransformation:
        """With LoRA, the targets checked to exist in the model, then the optimizer every trainer restricts
        (:meth:`BaseTrainer._restrict_optimizer`: the adapters alone, a quantized base out of its sight)."""
        if self.lora_rank > 0:
            targets = self.setting("model/lora/targets", lora.DEFAULT_TARGETS)
            lora.check_coverage(params, targets, type(self.model).__name__)
        return super()._restrict_optimizer(tx, params)

    def run(self) -> None:
        """Train; the chat template of the data is kept in the run folder (``chat_template.json``) so
        that ``generate generate/chat=true`` renders prompts the way the model was trained."""
        self.setup()
        template = self.chat_template()
        if template is not None and jax.process_index() == 0:
            folder = run_path(self.context.root, self.run_name)
            folder.mkdir(parents=True, exist_ok=True)
            replace_file(folder / TEMPLATE_FILE, json.dumps(template, indent=2) + "\n")
        super().run()

    def chat_template(self) -> dict[str, str] | None:
        """The chat template the prepared data was rendered with, with its special-token strings, in the
        ``tokenizer_config.json`` layout (None for data without one)."""
        flywheel = self._open_flywheel() if self.flywheel is None else self.flywheel
        for source in getattr(flywheel, "sources", []):
            recorded = source.prepared.header.source
            template = recorded.get("chat_template")
            if isinstance(template, str) and template:
                return {"chat_template": template, **dict(recorded.get("chat_tokens") or {})}
        return None

    def merged_params(self, state: TrainState | None = None) -> Any:
        """The parameters with every adapter folded into its kernel (the base layout, for export); a
        quantized base is dequantized first."""
        state = state if state is not None else self.state
        if state is None:
            raise ConfigError("no trained state: run the trainer (or restore a checkpoint) first")
        if self.lora_rank <= 0:
            return state.params
        params = state.params
        if frozen.has_frozen(params):
            with configuration(self.context.config):
                params = quantization.dequantize_params(params, plain_shapes(self.model))
        return lora.merge(params, float(self.setting("model/lora/alpha", 16.0)), self.lora_rank)


__all__ = ["SFTConfig", "SFTTrainer"]
