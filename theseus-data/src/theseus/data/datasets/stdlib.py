"""The offline standard-library corpus, re-exported from theseus-core (``theseus.data.stdlib``)."""

from theseus.data.stdlib import SKIP_DIRS, TEST_DIRS, PythonStdlib, stdlib_root

__all__ = ["SKIP_DIRS", "TEST_DIRS", "PythonStdlib", "stdlib_root"]
