"""A job file for ``theseus --load``: the tiny trainer with every shipped evaluation and analysis."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.training.tiny import TinyTrainer
from theseus.analysis import ActivationStatistics
from theseus.evaluation import MultipleChoice, Perplexity
from theseus.registry import job
from theseus.training.schedules import Cosine


@job("test/tiny/train")
class TinyJob(TinyTrainer):
    SCHEDULE = Cosine
    EVALUATION = [Perplexity, MultipleChoice]
    ANALYSIS = [ActivationStatistics]
