"""The layout of ``theseus.data``: packages shared by theseus-core and theseus-data, and deprecated paths.

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
#: Deprecated module -> (its replacement named in the warning, names it still exports).
ALIASES = {
    "theseus.data.tokenizer": (
        "theseus.data.tokenizers.base",
        {
            "theseus.data.tokenizers.base": ["EOT_TEXT", "Tokenizer", "encode_arrays"],
            "theseus.data.tokenizers.byte": ["ByteTokenizer"],
            "theseus.data.tokenizers.spec": ["load_tokenizer", "parse_spec", "spec_identity"],
        },
    ),
    "theseus.data.stdlib": (
        "theseus.data.datasets.stdlib",
        {"theseus.data.datasets.stdlib": ["PythonStdlib", "prepare_stdlib", "stdlib_root"]},
    ),
    "theseus.data.documents": (
        "theseus.data.datasets.base",
        {"theseus.data.datasets.base": ["TRAIN", "VAL", "Dataset", "Document", "dataset_classes", "resolve_dataset"]},
    ),
}


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


@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_a_deprecated_path_warns_and_keeps_its_names(alias: str, monkeypatch: pytest.MonkeyPatch) -> None:
    replacement, exported = ALIASES[alias]
    monkeypatch.delitem(sys.modules, alias, raising=False)
    with pytest.warns(DeprecationWarning, match=f"{alias} is deprecated; import from {replacement}"):
        module = importlib.import_module(alias)
    for home, names in exported.items():
        for name in names:
            assert getattr(module, name) is getattr(importlib.import_module(home), name), name


def test_the_data_packages_import_no_deprecated_path() -> None:
    """theseus.data and theseus-data use the new homes (other callers move within the deprecation window)."""
    found = []
    for root in (REPO / "theseus-core/src/theseus/data", REPO / "theseus-data/src"):
        for path in sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom):
                    modules = [node.module or ""]
                elif isinstance(node, ast.Import):
                    modules = [alias.name for alias in node.names]
                else:
                    continue
                found += [f"{path.relative_to(REPO)}:{node.lineno}: {m}" for m in modules if m in ALIASES]
    assert not found, found


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
