"""``Evaluation``: the base class of what a trainer's ``EVALUATION`` declaration lists."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from theseus.base.declared import Declared

if TYPE_CHECKING:
    from theseus.training.base import BaseTrainer


class Evaluation(Declared):
    """A measurement run on the train state at intervals and at the end of training.

    Subclasses are dataclasses whose ``field()`` attributes are configuration keys
    (conventionally ``evaluation/<name>/...``); the trainer builds them with ``configure``.
    ``evaluate`` returns scalars, logged as ``eval`` records named ``<name>/<key>``.
    """

    def evaluate(self, trainer: BaseTrainer, state: Any) -> Mapping[str, float]:
        raise NotImplementedError(f"{type(self).__qualname__}.evaluate() is not implemented")
