"""``Dataset``: a configurable source of documents, each routed to the train or validation split.

The base ships with theseus-core, beside the offline corpus (``theseus.data.datasets.stdlib``), so
that the preparation pipeline (``theseus.data.prepare``) needs no other distribution; theseus-data
adds FineWeb and the other downloadable sources to the same package.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from theseus.config import field
from theseus.errors import DataError, TheseusError

TRAIN, VAL = "train", "val"


@dataclass(frozen=True)
class Document:
    """One document: its ``text``; instruction data also has a ``prompt`` that precedes it.

    ``split`` is ``"train"``/``"val"`` when the source decides, or None to let the dataset route it.
    Chat data gives ``segments``: ``(text, learned)`` pieces tokenized one after the other (``text``
    is then their concatenation), so that only the learned pieces (assistant turns) are targets.
    """

    text: str
    prompt: str = ""
    split: str | None = None
    segments: tuple[tuple[str, bool], ...] = ()


@dataclass
class Dataset:
    """A source of documents that ``theseus.data.prepare.prepare`` (and the tokenize job) tokenizes.

    Subclasses set ``name`` (the prepared folder ``<root>/data/<name>/`` and the registered name
    ``dataset/<name>``), implement ``source()`` yielding documents in a deterministic order, and may
    declare more configuration with ``theseus.config.field``. ``documents()`` skips empty texts,
    routes documents without a split so that a ``val_fraction`` share, spread evenly, goes to
    validation (unless the source names its splits: ``names_splits()``), and stops after
    ``max_documents``.
    """

    name: ClassVar[str] = ""
    #: The sampling style the prepared data defaults to ("pmd" packed windows, "padded" one per
    #: row, "packed" several whole documents per row with segment ids).
    style: ClassVar[str] = "pmd"
    #: Whether documents carry ``segments`` whose learned tokens are stored as a per-token mask.
    masked: ClassVar[bool] = False

    max_documents: int | None = field(
        "data/max_documents", default=None, help="read at most this many documents (None: all)"
    )
    val_fraction: float = field(
        "data/val_fraction",
        default=0.01,
        help="share of documents routed to the validation split (none when the rows name their split)",
    )

    def __post_init__(self) -> None:
        if not (isinstance(self.val_fraction, (int, float)) and 0 <= self.val_fraction < 1):
            raise DataError(f"data/val_fraction must lie in [0, 1), got {self.val_fraction!r}")
        if self.max_documents is not None and self.max_documents < 1:
            raise DataError(f"data/max_documents must be at least 1 (or None for all), got {self.max_documents!r}")

    def source(self) -> Iterable[Document]:
        """Every document of the source, in a deterministic order."""
        raise NotImplementedError(f"{type(self).__qualname__}.source() is not implemented")

    def documents(self) -> Iterator[Document]:
        """The documents to prepare, each with its split set."""
        count = 0
        cap = self.max_documents
        routed = not self.names_splits()
        for doc in self.source():
            if cap is not None and count >= cap:
                return
            if not doc.text and not doc.prompt:
                continue
            split = doc.split or (self.split_of(count) if routed else TRAIN)
            yield doc if doc.split == split else dataclasses.replace(doc, split=split)
            count += 1

    def split_of(self, index: int) -> str:
        """``"val"`` for an evenly spread ``val_fraction`` of document indices, else ``"train"``."""
        f = self.val_fraction
        return VAL if f > 0 and math.floor((index + 1) * f) > math.floor(index * f) else TRAIN

    def names_splits(self) -> bool:
        """Whether the source names the splits of its documents itself (rows marked ``"split": "val"``).
        Then a document without a split is train and ``val_fraction`` routes none: the validation split
        is exactly the documents marked for it. A source without marks (the default) is split by
        ``val_fraction``."""
        return False

    @property
    def splits(self) -> tuple[str, ...]:
        """The splits prepared (a split a document names is added when it comes)."""
        return (TRAIN, VAL) if self.val_fraction > 0 and not self.names_splits() else (TRAIN,)

    def describe(self) -> dict[str, Any]:
        """What the header records as the data's source: the class and its configuration values."""
        values = {
            f.metadata["theseus_key"]: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if "theseus_key" in f.metadata
        }
        return {"dataset": self.name, "class": f"{type(self).__module__}:{type(self).__qualname__}", "config": values}

    def estimated_documents(self) -> int | None:
        """How many documents ``documents()`` will yield, when cheap to know (for the progress bar)."""
        return self.max_documents


def resolve_dataset(value: str | type[Dataset] | Dataset) -> type[Dataset] | Dataset:
    """A dataset class from a registered name (``"python-stdlib"`` or ``"dataset/python-stdlib"``)."""
    if not isinstance(value, str):
        return value
    from theseus.registry import resolve_component

    return resolve_component("dataset", value)  # type: ignore[no-any-return]


def dataset_classes() -> list[type]:
    """Every registered dataset class that declares configuration (failures are skipped)."""
    from theseus.registry import get_registry

    registry = get_registry()
    classes: list[type] = []
    for entry in registry.components_of("dataset"):
        try:
            cls = entry.load()
        except TheseusError as exc:
            registry.report(entry.distribution, entry.key, str(exc))
            continue
        if isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls not in classes:
            classes.append(cls)
    return classes
