"""A job file for ``theseus --load``: a GPT on the tiny trainer's counting batches (no prepared data)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.training.tiny import TinyTrainer
from theseus.registry import job


@job("test/memory/gpt")
class CountingGPT(TinyTrainer):
    MODEL = "gpt"
