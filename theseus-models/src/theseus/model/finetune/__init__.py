"""Fine-tuning: supervised (``SFTTrainer``: ``gpt/train/sft``, ``llama/train/sft``), on preferences
(``DPOTrainer``: ``gpt/train/dpo``, ``llama/train/dpo``), fully or with LoRA adapters.

See ``docs/fine-tuning.md``.
"""

from theseus.model.finetune.dpo import GPTDPO, DPOConfig, DPOTrainer, LlamaDPO
from theseus.model.finetune.trainer import GPTSFT, LlamaSFT, SFTConfig, SFTTrainer

__all__ = ["GPTDPO", "GPTSFT", "DPOConfig", "DPOTrainer", "LlamaDPO", "LlamaSFT", "SFTConfig", "SFTTrainer"]
