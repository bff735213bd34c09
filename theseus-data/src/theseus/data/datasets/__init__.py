"""Datasets: sources of documents that the tokenize job turns into token shards.

Registered components (``theseus components --kind dataset``):

* ``dataset/python-stdlib`` -- :class:`PythonStdlib`, this interpreter's standard library (offline;
  it lives in theseus-core as ``theseus.data.stdlib`` and is re-exported here with the ``Dataset`` base
  of ``theseus.data.documents``)
* ``dataset/fineweb`` -- :class:`FineWeb`, streamed from the hub or read from local parquet files
* ``dataset/local`` -- :class:`LocalText`, local text / JSONL / parquet files
* ``dataset/instructions`` -- :class:`Instructions`, prompt/response JSONL for the ``"padded"`` style
* ``dataset/chat`` -- :class:`Chat`, conversations (``messages`` JSONL) learned on assistant turns
"""

from theseus.data.datasets.chat import Chat
from theseus.data.datasets.fineweb import FineWeb
from theseus.data.datasets.instructions import Instructions
from theseus.data.datasets.local import LocalText
from theseus.data.documents import TRAIN, VAL, Dataset, Document, dataset_classes, resolve_dataset
from theseus.data.stdlib import PythonStdlib

__all__ = [
    "TRAIN",
    "VAL",
    "Chat",
    "Dataset",
    "Document",
    "FineWeb",
    "Instructions",
    "LocalText",
    "PythonStdlib",
    "dataset_classes",
    "resolve_dataset",
]
