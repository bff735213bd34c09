"""``Evaluation``: the base class of what a trainer's ``EVALUATION`` declaration lists."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from theseus.training.base import BaseTrainer


class Evaluation:
    """A measurement run on the train state at intervals and at the end of training.

    Subclasses are dataclasses whose ``field()`` attributes are configuration keys
    (conventionally ``evaluation/<name>/...``); the trainer builds them with ``configure``.
    ``evaluate`` returns scalars, logged as ``eval`` records named ``<name>/<key>``.
    """

    name: ClassVar[str] = ""

    @classmethod
    def config(cls) -> list[type]:
        """Configuration classes this evaluation contributes to the job's schema."""
        return [cls] if dataclasses.is_dataclass(cls) else []

    @classmethod
    def label(cls) -> str:
        return cls.name or cls.__name__.lower()

    def evaluate(self, trainer: BaseTrainer, state: Any) -> Mapping[str, float]:
        raise NotImplementedError(f"{type(self).__qualname__}.evaluate() is not implemented")
