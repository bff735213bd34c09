"""Jobs of the scale-out tests (a ``--load`` file): a small GPT on prepared byte data.

``test/distributed/gpt`` reads a mixture of the prepared ``fineweb`` data ("pmd" windows) and
``chat`` data (one "padded" document per row) through the trainer's own flywheel. The global
batch of a step does not depend on the process count, so ``test/distributed/gpt-plain`` (the
same job without evaluations) trained in one process must follow the curve of two processes.
"""

import sys
from pathlib import Path
from typing import Any, ClassVar

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from theseus.analysis import ActivationStatistics
from theseus.evaluation import MultipleChoice, Perplexity
from theseus.registry import job
from theseus.training.base import BaseTrainer
from theseus.training.flywheel.strategy import Sampling


@job("test/distributed/gpt")
class DistributedGPT(BaseTrainer):
    """The flywheel-fed job, with evaluations and an analysis (collective work on every process)."""

    MODEL = "gpt"
    DATASET: ClassVar[Any] = [Sampling("fineweb", 0.75, "pmd"), Sampling("chat", 0.25, "padded")]
    EVALUATION = [Perplexity, MultipleChoice]
    ANALYSIS = [ActivationStatistics]


@job("test/distributed/gpt-plain")
class PlainGPT(DistributedGPT):
    """The same job and data without evaluations and analyses."""

    EVALUATION: ClassVar[list[Any]] = []
    ANALYSIS: ClassVar[list[Any]] = []
