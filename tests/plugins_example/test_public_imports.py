"""The example plugin is written the way a third party would write it: public theseus imports only."""

from __future__ import annotations

import ast

from tests.conftest import REPO

PACKAGE = REPO / "theseus-plugins-example" / "src" / "theseus_plugins_example"


def imported_names() -> list[tuple[str, str, str]]:
    """``(file, module, name)`` for every import in the package."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module:
                found += [(path.name, node.module, alias.name) for alias in node.names]
            elif isinstance(node, ast.Import):
                found += [(path.name, alias.name, "") for alias in node.names]
    return found


def test_only_public_theseus_names_are_imported() -> None:
    names = imported_names()
    theseus = [(f, m, n) for f, m, n in names if m == "theseus" or m.startswith("theseus.")]
    assert theseus, "the example imports nothing from theseus?"
    private = [(f, m, n) for f, m, n in theseus if any(part.startswith("_") for part in [*m.split("."), n])]
    assert not private, f"private theseus imports: {private}"
    assert not [(f, m) for f, m, _ in names if m == "tests" or m.startswith("tests.")]


def test_the_plugin_module_imports_no_heavy_library() -> None:
    heavy = ("jax", "flax", "optax", "numpy", "datasets", "orbax")
    hooks = [(m, n) for f, m, n in imported_names() if f == "hooks.py"]
    assert not [m for m, _ in hooks if m.split(".")[0] in heavy]
    assert {m for m, _ in hooks if m.startswith("theseus.")} <= {"theseus.config", "theseus.errors", "theseus.plugins"}
