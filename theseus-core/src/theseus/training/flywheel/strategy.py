"""What a trainer reads: ``Sampling(dataset, rate, style)`` and a ``Strategy`` mixing samplings by rate."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from theseus.data.format import STYLES
from theseus.errors import DataError, TheseusError

RATE_TOLERANCE = 1e-6


def dataset_name(dataset: Any) -> str:
    """The prepared-folder name of a dataset: a class's (or instance's) ``name``, or a registered name."""
    if isinstance(dataset, str):
        name = dataset.removeprefix("dataset/")
        if not name:
            raise DataError(f"dataset name {dataset!r} is empty; give a registered name such as 'python-stdlib'")
        cls = registered_dataset(name)
        resolved = getattr(cls, "name", None) if cls is not None else None
        return resolved if isinstance(resolved, str) and resolved else name
    found = getattr(dataset, "name", None)
    if not isinstance(found, str) or not found:
        raise DataError(
            f"dataset {dataset!r} has no 'name'; give the class a name attribute (its prepared folder) "
            "or pass a registered dataset name"
        )
    return found


def registered_dataset(name: str) -> Any:
    """The class registered as ``dataset/<name>``, or None when nothing (usable) is registered."""
    from theseus.registry import get_registry

    try:
        return get_registry().load_component("dataset", name)
    except TheseusError:
        return None


@dataclass(frozen=True)
class Sampling:
    """Draw a share ``rate`` of every batch from ``dataset`` in ``style``.

    ``dataset`` is a dataset class (``FineWeb``) or a registered name (``"fineweb"``); the loader reads
    ``<root>/data/<name>/``. ``style`` is ``"pmd"`` (random windows of packed tokens), ``"padded"``
    (one document per row), ``"packed"`` (several whole documents per row, kept apart by segment
    ids) or ``"pairs"`` (the two documents of a preference pair in consecutive rows); ``None`` uses
    the style recorded when the data was prepared.
    """

    dataset: Any
    rate: float = 1.0
    style: str | None = None

    def __post_init__(self) -> None:
        rate = self.rate
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate <= 0:
            raise DataError(f"Sampling rate must be a number above 0, got {rate!r} for {self.label}")
        if self.style is not None and self.style not in STYLES:
            raise DataError(f"Sampling style {self.style!r} for {self.label} is not one of {', '.join(STYLES)}")
        if not isinstance(self.dataset, str) and not isinstance(getattr(self.dataset, "name", None), str):
            raise DataError(
                f"Sampling dataset {self.dataset!r} is neither a registered name nor a dataset class with a 'name'"
            )

    @property
    def label(self) -> str:
        if isinstance(self.dataset, str):
            return self.dataset
        return getattr(self.dataset, "__name__", None) or str(getattr(self.dataset, "name", self.dataset))

    @property
    def name(self) -> str:
        """The prepared-folder name (``<root>/data/<name>``)."""
        return dataset_name(self.dataset)

    @property
    def dataset_key(self) -> str:
        """The name to pass as ``data/dataset=`` to the tokenize job."""
        if isinstance(self.dataset, str):
            return self.dataset.removeprefix("dataset/")
        return self.name

    def dataset_class(self) -> Any:
        """The dataset class, when one is given or registered (None for an unregistered name)."""
        if isinstance(self.dataset, type):
            return self.dataset
        if isinstance(self.dataset, str):
            return registered_dataset(self.dataset.removeprefix("dataset/"))
        return type(self.dataset)

    def config(self) -> list[type]:
        """The configuration classes this sampling contributes (its dataset class, if any)."""
        cls = self.dataset_class()
        return [cls] if isinstance(cls, type) and dataclasses.is_dataclass(cls) else []


class Strategy(Sequence[Sampling]):
    """Several samplings whose rates are above 0 and sum to 1 (within 1e-6)."""

    def __init__(self, samplings: Sequence[Sampling]) -> None:
        self.samplings = list(samplings)
        if not self.samplings:
            raise DataError("no dataset to sample from; declare DATASET = Sampling(MyDataset, 1.0, 'pmd')")
        for s in self.samplings:
            if not isinstance(s, Sampling):
                raise DataError(f"{s!r} is not a Sampling; declare Sampling(dataset, rate, style)")
        total = math.fsum(s.rate for s in self.samplings)
        if abs(total - 1.0) > RATE_TOLERANCE:
            rates = ", ".join(f"{s.label}={s.rate:g}" for s in self.samplings)
            raise DataError(f"sampling rates ({rates}) sum to {total:g}; make them sum to 1")

    @property
    def rates(self) -> list[float]:
        return [s.rate for s in self.samplings]

    def config(self) -> list[type]:
        classes: list[type] = []
        for s in self.samplings:
            classes += [c for c in s.config() if c not in classes]
        return classes

    def __getitem__(self, i: Any) -> Any:
        return self.samplings[i]

    def __len__(self) -> int:
        return len(self.samplings)

    def __iter__(self) -> Iterator[Sampling]:
        return iter(self.samplings)

    def __repr__(self) -> str:
        return f"Strategy({self.samplings!r})"


def strategy_of(declaration: Any) -> Strategy:
    """A ``Strategy`` from what a trainer declares as DATASET.

    Accepted: a ``Sampling``, a dataset class or registered name (rate 1), a ``Strategy``, or a list
    of these; in a list, entries without a rate share what the ``Sampling`` entries leave equally.
    """
    if isinstance(declaration, Strategy):
        return declaration
    items = list(declaration) if isinstance(declaration, (list, tuple)) else [declaration]
    explicit = [i for i in items if isinstance(i, Sampling)]
    bare = [i for i in items if not isinstance(i, Sampling)]
    if bare:
        left = 1.0 - math.fsum(s.rate for s in explicit)
        if left <= RATE_TOLERANCE:
            labels = ", ".join(getattr(b, "__name__", None) or str(b) for b in bare)
            raise DataError(
                f"the Sampling rates already sum to 1, leaving nothing for {labels}; give every entry a Sampling rate"
            )
        share = left / len(bare)
        converted = {id(b): Sampling(b, share) for b in bare}
        items = [i if isinstance(i, Sampling) else converted[id(i)] for i in items]
    return Strategy(items)


__all__ = ["STYLES", "Sampling", "Strategy", "dataset_name", "strategy_of"]
