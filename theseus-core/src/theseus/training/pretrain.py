"""Built-in pretraining jobs: ``gpt/train/pretrain`` and ``llama/train/pretrain``.

Both read the prepared ``python-stdlib`` corpus (the offline default: prepare it with
``theseus run data/tokenize data/dataset=python-stdlib``) with a warmup-stable-decay schedule
and report perplexity at the end. Models are named by their registered component names, so
this module imports nothing beyond the core; ``theseus-models`` must be installed to run them.
Subclass them (``DATASET = Sampling(FineWeb, 1.0, "pmd")``) to train on other data.
"""

from __future__ import annotations

from typing import Any, ClassVar

from theseus.evaluation import Perplexity
from theseus.training.base import BaseTrainer
from theseus.training.flywheel.strategy import Sampling
from theseus.training.optimizers import AdamW
from theseus.training.schedules import WSD


class GPTPretrain(BaseTrainer):
    """GPT (``model/gpt``) on the prepared ``python-stdlib`` corpus."""

    MODEL: ClassVar[Any] = "gpt"
    DATASET: ClassVar[Any] = Sampling("python-stdlib", 1.0, "pmd")
    OPTIMIZER: ClassVar[Any] = AdamW
    SCHEDULE: ClassVar[Any] = WSD
    EVALUATION: ClassVar[Any] = [Perplexity]


class LlamaPretrain(GPTPretrain):
    """The Llama-style model (``model/llama``) on the prepared ``python-stdlib`` corpus."""

    MODEL: ClassVar[Any] = "llama"
