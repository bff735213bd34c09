"""The offline corpus every machine has: the Python standard library's own ``.py`` source files.

It ships with theseus-core (registered as ``dataset/python-stdlib``) so that ``demo/gpt``,
``train/pretrain`` (with any model) trains with only theseus-core and theseus-models
installed; ``prepare_stdlib`` tokenizes it byte-level on first use.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from theseus.config import field
from theseus.data.datasets.base import Dataset, Document
from theseus.errors import DataError

if TYPE_CHECKING:
    from theseus.data.format import Prepared

#: Folders that are not the standard library proper (installed packages, caches).
SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})
#: Test suites, left out unless ``data/python-stdlib/include_tests`` is set (they double the size).
TEST_DIRS = frozenset({"test", "tests", "idle_test"})


def stdlib_root() -> Path:
    """Where this interpreter's standard library lives."""
    return Path(sysconfig.get_paths()["stdlib"])


@dataclass
class PythonStdlib(Dataset):
    """Every ``.py`` file of this interpreter's standard library, one document per file (no download).

    Files are read in sorted order of their path relative to the library folder and an evenly spread
    ``data/val_fraction`` of them (every 100th at 0.01) is the validation split, so the split is the
    same on every machine with the same Python version, and capping with ``data/max_documents``
    keeps the first files with the same assignment.
    """

    name: ClassVar[str] = "python-stdlib"

    include_tests: bool = field(
        "data/python-stdlib/include_tests", default=False, help="also read the test suites (about 2x larger)"
    )

    def files(self) -> list[tuple[str, Path]]:
        """``(relative path, path)`` of every source file, sorted by relative path."""
        root = stdlib_root()
        if not root.is_dir():
            raise DataError(f"the standard library folder {root} is missing; use another dataset (data/dataset=...)")
        skip = SKIP_DIRS if self.include_tests else SKIP_DIRS | TEST_DIRS
        found = []
        for folder, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if d not in skip]
            base = Path(folder)
            for file_name in names:
                if file_name.endswith(".py"):
                    path = base / file_name
                    found.append((path.relative_to(root).as_posix(), path))
        found.sort()
        return found

    def source(self) -> Iterator[Document]:
        for _, path in self.files():
            text = path.read_bytes().decode("utf-8", errors="replace")
            yield Document(text)

    def estimated_documents(self) -> int | None:
        total = len(self.files())
        return min(total, self.max_documents) if self.max_documents is not None else total

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info["origin"] = str(stdlib_root())
        info["python"] = ".".join(map(str, sys.version_info[:3]))
        return info


def prepare_stdlib(root: str | Path, *, note: Callable[[str], None] | None = None) -> Prepared:
    """The byte-level corpus in ``<root>/data/python-stdlib``, prepared now if it is missing.

    Its configuration (``data/max_documents`` ...) comes from the active configuration; data already
    prepared differently is a DataError naming the fix. ``note`` is told before a preparation starts.
    """
    from theseus.data.format import data_folder
    from theseus.data.prepare import is_prepared, prepare

    if note is not None and not is_prepared(root, PythonStdlib.name):
        note(f"preparing the Python standard library (byte-level) in {data_folder(root, PythonStdlib.name)}")
    return prepare(PythonStdlib, root, tokenizer="byte")
