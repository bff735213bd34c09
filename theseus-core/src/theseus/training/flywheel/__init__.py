"""The flywheel: the training data loader over prepared token shards.

``Flywheel(samplings, root=..., block_size=..., batch_size=..., seed=...)`` reads the datasets that
``theseus run data/tokenize`` prepared under ``<root>/data/``; ``Sampling`` and ``Strategy`` (in
``theseus.training.flywheel.strategy``) say which datasets to mix, at which rates and in which style.
The global batch of a step does not depend on how many processes read it (``feed_rows``).
"""

from theseus.training.flywheel.loader import Batch, Flywheel, feed_rows
from theseus.training.flywheel.strategy import STYLES, Sampling, Strategy, dataset_name, strategy_of

__all__ = ["STYLES", "Batch", "Flywheel", "Sampling", "Strategy", "dataset_name", "feed_rows", "strategy_of"]
