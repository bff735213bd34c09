"""Deprecated: the ``Dataset`` base and ``Document`` live in ``theseus.data.datasets.base``. This alias
is kept for one minor version."""

from __future__ import annotations

import warnings

from theseus.data.datasets.base import TRAIN, VAL, Dataset, Document, dataset_classes, resolve_dataset

warnings.warn(
    "theseus.data.documents is deprecated; import from theseus.data.datasets.base",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["TRAIN", "VAL", "Dataset", "Document", "dataset_classes", "resolve_dataset"]
