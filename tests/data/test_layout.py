"""The layout of ``theseus.data``: packages shared by theseus-core and theseus-data, and removed paths.

``theseus.data.datasets`` and ``theseus.data.tokenizers`` hold modules of both distributions; the
``__init__.py`` of each (theseus-data's) binds every public name lazily from the module defining it.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, clean_env

FACADES = {
    "theseus.data.datasets": REPO / "theseus-data/src/theseus/data/datasets/__init__.py",
    "theseus.data.tokenizers": REPO / "theseus-data/src/theseus/data/tokenizers/__init__.py",
}
#: Former module paths, removed before the first release: nothing provides them.
REMOVED = ("theseus.data.documents", "theseus.data.stdlib", "theseus.data.tokenizer")


def type_checking_imports(path: Path) -> set[str]:
    """The names an ``__init__.py`` imports under ``if TYPE_CHECKING:`` (what type checkers see)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            names |= {alias.name for sub in node.body if isinstance(sub, ast.ImportFrom) for alias in sub.names}
    return names


@pytest.mark.parametrize("package", sorted(FACADES))
def test_every_public_name_resolves_from_the_module_that_defines_it(package: str) -> None:
    facade = importlib.import_module(package)
    homes = facade._HOMES
    assert sorted(facade.__all__) == sorted(homes) == sorted(type_checking_imports(FACADES[package]))
    for name, home in homes.items():
        assert getattr(facade, name) is getattr(importlib.import_module(f"{package}.{home}"), name)
    assert set(homes) <= set(dir(facade))
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = facade.Nope


def test_both_distributions_modules_are_found_and_imported_lazily() -> None:
    code = (
        "import sys\n"
        "import theseus.data.datasets.stdlib, theseus.data.tokenizers.byte\n"
        "print(sorted(m for m in sys.modules if m.startswith(('theseus.data.datasets', 'theseus.data.tokenizers'))))\n"
        "from theseus.data.datasets import FineWeb, PythonStdlib\n"
        "from theseus.data.tokenizers import ByteTokenizer, HFTokenizer\n"
        "print(FineWeb.__module__, PythonStdlib.__module__, ByteTokenizer.__module__, HFTokenizer.__module__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), cwd="/")
    assert done.returncode == 0, done.stderr
    loaded, modules = done.stdout.splitlines()
    assert loaded == str(
        [
            "theseus.data.datasets",
            "theseus.data.datasets.base",
            "theseus.data.datasets.stdlib",
            "theseus.data.tokenizers",
            "theseus.data.tokenizers.base",
            "theseus.data.tokenizers.byte",
        ]
    )
    assert modules.split() == [
        "theseus.data.datasets.fineweb",
        "theseus.data.datasets.stdlib",
        "theseus.data.tokenizers.byte",
        "theseus.data.tokenizers.huggingface",
    ]


@pytest.mark.parametrize("path", REMOVED)
def test_a_removed_path_is_gone(path: str) -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(path)


def test_core_and_models_never_import_the_facades_of_theseus_data() -> None:
    """``from theseus.data.datasets import X`` needs theseus-data; theseus-core and theseus-models import
    the defining module (``theseus.data.datasets.stdlib``) so that they work without it."""
    found = []
    for root in (REPO / "theseus-core/src", REPO / "theseus-models/src"):
        for path in sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module in FACADES:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}: from {node.module} import ...")
    assert not found, found
