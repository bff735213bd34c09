"""The guide's first example, verbatim: ``MyTrainer`` on GPT and FineWeb."""
# ruff: noqa: I001
# fmt: off

from theseus.data.datasets import FineWeb
from theseus.model.models import GPT
from theseus.registry import job
from theseus.training.base import BaseTrainer, BaseTrainerConfig
from theseus.training.flywheel.strategy import Sampling
from theseus.training.optimizers import AdamW
from theseus.training.schedules import WSD

@job("my/gpt/train")
class MyTrainer(BaseTrainer):
    CONFIG = BaseTrainerConfig
    MODEL = GPT
    DATASET = Sampling(FineWeb, 1.0, "pmd")
    OPTIMIZER = AdamW
    SCHEDULE = WSD
    EVALUATION = []
    ANALYSIS = []
