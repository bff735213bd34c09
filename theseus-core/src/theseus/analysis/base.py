"""``Analysis``: the base class of what a trainer's ``ANALYSIS`` declaration lists."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from theseus.base.declared import Declared

if TYPE_CHECKING:
    from theseus.training.base import BaseTrainer


class Analysis(Declared):
    """An inspection of the model at intervals and at the end of training.

    Subclasses are dataclasses whose ``field()`` attributes are configuration keys
    (conventionally ``analysis/<name>/...``). ``analyze`` writes its artefacts into
    ``out_dir`` (``<run dir>/analysis/<name>``) and may return scalars for the metrics.
    Use ``trainer.capture(state, batch, key)`` to run the trainer's ``trace()`` with every
    module's output recorded.
    """

    def analyze(self, trainer: BaseTrainer, state: Any, step: int, out_dir: Path) -> Mapping[str, float] | None:
        raise NotImplementedError(f"{type(self).__qualname__}.analyze() is not implemented")
