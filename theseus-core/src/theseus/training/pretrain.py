"""The built-in pretraining job, ``train/pretrain``: GPT by default, any registered model with ``model=``.

It reads the ``python-stdlib`` corpus (the offline default, byte-level) with a warmup-stable-decay
schedule and reports perplexity at the end. The corpus ships with theseus-core and is prepared into
``<root>/data/python-stdlib`` on the first run when it is missing (data prepared earlier, e.g. by
``theseus run data/tokenize data/max_documents=...``, is read as it is). Models are named by their
registered component names, so this module imports nothing beyond the core; ``theseus-models``
must be installed to run it.
Subclass it (``DATASET = Sampling(FineWeb, 1.0, "pmd")``) to train on other data.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

import click

from theseus.config import configuration
from theseus.errors import DataError
from theseus.evaluation import Perplexity
from theseus.training import declarations
from theseus.training.base import BaseTrainer
from theseus.training.flywheel.strategy import Sampling
from theseus.training.optimizers import AdamW
from theseus.training.schedules import WSD


class Pretrain(BaseTrainer):
    """A language model (``model/gpt`` unless ``model=`` selects another) on the prepared ``python-stdlib``
    corpus."""

    MODEL: ClassVar[Any] = "gpt"
    DATASET: ClassVar[Any] = Sampling("python-stdlib", 1.0, "pmd")
    OPTIMIZER: ClassVar[Any] = AdamW
    SCHEDULE: ClassVar[Any] = WSD
    EVALUATION: ClassVar[Any] = [Perplexity]

    def run(self) -> None:
        """Prepare the offline corpus if this job reads it and it is missing, then train."""
        prepare_offline_corpus(self)
        super().run()


def prepare_offline_corpus(trainer: BaseTrainer, *, wait: float = 600.0) -> None:
    """Prepare ``python-stdlib`` byte-level under the trainer's root when it declares it and it is missing.

    When another process is preparing it (every process of a multi-process run on a shared root
    gets here), this one waits up to ``wait`` seconds for it and then reads what it wrote.
    """
    from theseus.data.datasets.stdlib import PythonStdlib, prepare_stdlib
    from theseus.data.prepare import is_prepared

    root = trainer.context.root
    for declared in declarations.as_list(trainer.DATASET):
        sampling = declared if isinstance(declared, Sampling) else Sampling(declared)
        if sampling.dataset_class() is not PythonStdlib or is_prepared(root, PythonStdlib.name):
            continue
        deadline = time.monotonic() + wait
        while True:
            try:
                with configuration(trainer.context.config):
                    prepare_stdlib(root, note=lambda text: click.echo(text, err=True))
                break
            except DataError as exc:
                if not isinstance(exc.__cause__, BlockingIOError) or time.monotonic() > deadline:
                    raise  # not another preparer holding the lock, or it took too long
            time.sleep(0.2)
