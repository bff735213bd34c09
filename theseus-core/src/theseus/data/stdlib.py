"""Deprecated: the standard-library corpus lives in ``theseus.data.datasets.stdlib``. This alias is
kept for one minor version."""

from __future__ import annotations

import warnings

from theseus.data.datasets.stdlib import SKIP_DIRS, TEST_DIRS, PythonStdlib, prepare_stdlib, stdlib_root

warnings.warn(
    "theseus.data.stdlib is deprecated; import from theseus.data.datasets.stdlib",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["SKIP_DIRS", "TEST_DIRS", "PythonStdlib", "prepare_stdlib", "stdlib_root"]
