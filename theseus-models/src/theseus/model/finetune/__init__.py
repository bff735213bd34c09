"""Fine-tuning: supervised (``SFTTrainer``: ``train/sft``), on preferences (``DPOTrainer``:
``train/dpo``), fully or with LoRA adapters; GPT unless ``model=`` or ``training/init_from``'s source
says otherwise.

See ``docs/fine-tuning.md``.
"""

from theseus.model.finetune.dpo import DPOConfig, DPOTrainer
from theseus.model.finetune.trainer import SFTConfig, SFTTrainer

__all__ = ["DPOConfig", "DPOTrainer", "SFTConfig", "SFTTrainer"]
