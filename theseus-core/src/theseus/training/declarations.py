"""Turning a trainer's declarations (MODEL, DATASET, OPTIMIZER, ...) into components and schemas."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from theseus.registry import resolve_component


def as_list(value: Any) -> list[Any]:
    """``None``/``[]`` -> ``[]``; a single declaration -> ``[it]``; lists and tuples as they are."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def resolve(kind: str, value: Any) -> Any:
    """A registered name (``"adamw"``) or the object itself."""
    return resolve_component(kind, value) if isinstance(value, str) else value


def contributed_classes(obj: Any) -> list[type]:
    """The configuration classes a declared object brings: its ``config()``/``CONFIG``, or itself.

    Classes with a ``gather()`` (models) contribute what ``gather()`` returns.
    """
    if obj is None:
        return []
    gather = getattr(obj, "gather", None)
    if isinstance(obj, type) and callable(gather):
        return list(gather())
    config = getattr(obj, "config", None)
    if isinstance(config, type):  # Optimizer / Schedule containers
        return [config]
    if callable(config):
        try:
            return list(config())
        except TypeError:
            pass
    found: list[type] = []
    declared = getattr(obj, "CONFIG", None)
    if isinstance(declared, type):
        found.append(declared)
    if isinstance(obj, type) and dataclasses.is_dataclass(obj):
        found.append(obj)
    return found


def dataset_classes(declaration: Any) -> list[type]:
    """Configuration classes of the datasets a DATASET declaration samples from (validates rates)."""
    if not as_list(declaration):
        return []
    from theseus.training.flywheel.strategy import strategy_of

    return list(strategy_of(declaration).config())


def unique(classes: Iterable[type]) -> list[type]:
    seen: set[int] = set()
    ordered = []
    for klass in classes:
        if id(klass) in seen:
            continue
        seen.add(id(klass))
        ordered.append(klass)
    return ordered
