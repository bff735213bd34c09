"""Jobs of the scale-out tests (a ``--load`` file): a small GPT on prepared byte data.

``test/distributed/gpt`` reads the prepared ``fineweb`` data through the trainer's flywheel, so
under several processes each process feeds its own share. ``test/distributed/gpt-two-shares``
is the same job (without evaluations) fed, in one process, with exactly the global batches two processes feed
together: shares 0 and 1 of the flywheel, concatenated in process order.
"""

import sys
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from theseus.analysis import ActivationStatistics
from theseus.evaluation import MultipleChoice, Perplexity
from theseus.registry import job
from theseus.training.base import BaseTrainer
from theseus.training.flywheel import Flywheel
from theseus.training.flywheel.strategy import Sampling

SHARES = 2


@job("test/distributed/gpt")
class DistributedGPT(BaseTrainer):
    """The flywheel-fed job, with evaluations and an analysis (collective work on every process)."""

    MODEL = "gpt"
    DATASET = Sampling("fineweb", 1.0, "pmd")
    EVALUATION = [Perplexity, MultipleChoice]
    ANALYSIS = [ActivationStatistics]


@job("test/distributed/gpt-two-shares")
class TwoShares(DistributedGPT):
    """One process feeding what ``SHARES`` processes feed: every share of the flywheel, in order."""

    EVALUATION: ClassVar[list[Any]] = []
    ANALYSIS: ClassVar[list[Any]] = []

    _shares: list[Flywheel] | None = None

    def batch(self, slice: str = "train") -> dict[str, np.ndarray]:
        if self._shares is None:
            self._shares = [
                Flywheel(
                    self.DATASET,
                    root=self.context.root,
                    block_size=self.sequence_length,
                    batch_size=self.batch_rows // SHARES,
                    seed=self.args.seed,
                    process_index=index,
                    process_count=SHARES,
                )
                for index in range(SHARES)
            ]
        parts = [share.batch(self.position(slice), slice) for share in self._shares]
        return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}

    def close(self) -> None:
        for share in self._shares or []:
            share.close()
        self._shares = None
        super().close()
