"""``Declared``: what a trainer's EVALUATION / ANALYSIS declarations list have in common."""

from __future__ import annotations

import dataclasses
from typing import ClassVar


class Declared:
    """A class listed by a trainer declaration: it contributes its own ``field()`` keys to the
    job's schema (when it is a dataclass) and is named by ``label()`` in the run's outputs."""

    name: ClassVar[str] = ""

    @classmethod
    def config(cls) -> list[type]:
        """Configuration classes this contributes to the job's schema."""
        return [cls] if dataclasses.is_dataclass(cls) else []

    @classmethod
    def label(cls) -> str:
        """``name``, or the lower-cased class name."""
        return cls.name or cls.__name__.lower()
