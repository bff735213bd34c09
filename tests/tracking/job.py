"""A job file for ``theseus --load``: the tiny counting-sequence trainer (no prepared data needed)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.training.tiny import TinyTrainer
from theseus.registry import job


@job("test/tracking/tiny")
class TrackedTiny(TinyTrainer):
    """The tiny trainer under a job key, for runs started from the command line."""
