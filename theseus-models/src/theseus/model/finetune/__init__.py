"""Supervised fine-tuning: the ``SFTTrainer`` job (``gpt/train/sft``, ``llama/train/sft``) and LoRA training.

See ``docs/fine-tuning.md``.
"""

from theseus.model.finetune.trainer import GPTSFT, LlamaSFT, SFTConfig, SFTTrainer

__all__ = ["GPTSFT", "LlamaSFT", "SFTConfig", "SFTTrainer"]
