"""The ``Dataset`` base, re-exported from theseus-core (``theseus.data.documents``), where it lives."""

from theseus.data.documents import TRAIN, VAL, Dataset, Document, dataset_classes, resolve_dataset

__all__ = ["TRAIN", "VAL", "Dataset", "Document", "dataset_classes", "resolve_dataset"]
