"""Datasets: sources of documents that the tokenize job turns into token shards.

This package is shared by two distributions. theseus-core ships the ``Dataset`` base (``.base``) and
the offline corpus (``.stdlib``); theseus-data ships the sources that need data libraries and this
file, the only ``__init__.py`` of the package, which makes every public name importable from the
package itself (``from theseus.data.datasets import FineWeb, PythonStdlib``). A name is imported from
its module on first use, so importing one module does not import the others. With theseus-core
alone the package is a plain namespace: import from its modules (``theseus.data.datasets.stdlib``).

Registered components (``theseus components --kind dataset``):

* ``dataset/python-stdlib`` -- :class:`PythonStdlib`, this interpreter's standard library (offline, theseus-core)
* ``dataset/fineweb`` -- :class:`FineWeb`, streamed from the hub or read from local parquet files
* ``dataset/local`` -- :class:`LocalText`, local text / JSONL / parquet files
* ``dataset/instructions`` -- :class:`Instructions`, prompt/response JSONL for the ``"padded"`` style
* ``dataset/chat`` -- :class:`Chat`, conversations (``messages`` JSONL) learned on assistant turns
* ``dataset/preference`` -- :class:`Preference`, prompt + chosen + rejected JSONL for the ``"pairs"`` style
"""

from __future__ import annotations

from pkgutil import extend_path
from typing import TYPE_CHECKING

from theseus.base.lazy import lazy_exports

# theseus-core's modules of this package may lie in another folder (editable installs): look there too.
__path__ = extend_path(__path__, __name__)

#: Each public name and the module of this package that defines it.
_HOMES = {
    "TRAIN": "base",
    "VAL": "base",
    "Dataset": "base",
    "Document": "base",
    "dataset_classes": "base",
    "resolve_dataset": "base",
    "PythonStdlib": "stdlib",
    "Chat": "chat",
    "FineWeb": "fineweb",
    "Instructions": "instructions",
    "LocalText": "local",
    "Preference": "preference",
}

if TYPE_CHECKING:
    from theseus.data.datasets.base import TRAIN, VAL, Dataset, Document, dataset_classes, resolve_dataset
    from theseus.data.datasets.chat import Chat
    from theseus.data.datasets.fineweb import FineWeb
    from theseus.data.datasets.instructions import Instructions
    from theseus.data.datasets.local import LocalText
    from theseus.data.datasets.preference import Preference
    from theseus.data.datasets.stdlib import PythonStdlib


__getattr__, __dir__ = lazy_exports(__name__, _HOMES)

__all__ = [
    "TRAIN",
    "VAL",
    "Chat",
    "Dataset",
    "Document",
    "FineWeb",
    "Instructions",
    "LocalText",
    "Preference",
    "PythonStdlib",
    "dataset_classes",
    "resolve_dataset",
]
