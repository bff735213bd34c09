"""Every import of a package a distribution does not declare is guarded: it sits in a ``try`` whose
``except ImportError`` raises one line naming what to ``pip install`` (or under ``TYPE_CHECKING``).

So a job run with only the declared dependencies installed either works or says which extra to
install; it never ends in a bare ``ModuleNotFoundError``. The imports are read from the AST of
each distribution's ``src/`` tree (module-level and function-local ones alike).
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO

DISTRIBUTIONS = ("theseus-core", "theseus-models", "theseus-data", "theseus-plugins-example")
#: Distribution names whose import name differs from the name (the rest: lower case, '-' -> '_').
IMPORT_NAMES = {
    "orbax-checkpoint": "orbax",
    "pyyaml": "yaml",
    "mlflow-skinny": "mlflow",
    "huggingface-hub": "huggingface_hub",
}
#: Lines that name the fix a user needs.
ADVICE = re.compile(r"pip install")
#: Tracker modules, imported only after ``metrics/sinks`` found their package installed
#: (``theseus.tracking.sinks.selected_sinks``; checked by the last test here).
CHECKED_ON_SELECTION = {
    "theseus-core/src/theseus/tracking/tensorboard.py": "tensorboard",
    "theseus-core/src/theseus/tracking/wandb.py": "wandb",
    "theseus-core/src/theseus/tracking/mlflow.py": "mlflow",
}
#: Packages whose modules are imported only after a check that names the extra: the lm-eval harness
#: (``theseus.model.harness.dependency.require_lm_eval``, called first by the job and the evaluation;
#: tests/harness checks the one line it gives without lm-eval).
CHECKED_BEFORE_IMPORT = {"theseus-models/src/theseus/model/harness": "lm_eval"}


@dataclass(frozen=True)
class Import:
    module: str
    file: Path
    line: int
    guarded: bool


def requirement_name(requirement: str) -> str:
    return re.split(r"[\s<>=!~\[;(]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def declared(distribution: str) -> set[str]:
    """Import names a distribution may use freely: its own dependencies and those of the theseus
    distributions it depends on."""
    project = tomllib.loads((REPO / distribution / "pyproject.toml").read_text())["project"]
    names: set[str] = set()
    for requirement in project.get("dependencies", []):
        name = requirement_name(requirement)
        if name in DISTRIBUTIONS:
            names |= declared(name)
        else:
            names.add(IMPORT_NAMES.get(name, name.replace("-", "_")))
    return names


def advice_strings(tree: ast.Module) -> set[str]:
    """Module-level names bound to a string that names a ``pip install``."""
    names = set()
    for node in tree.body:
        value = node.value if isinstance(node, ast.Assign) else None
        if isinstance(value, ast.Constant) and isinstance(value.value, str) and ADVICE.search(value.value):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}  # type: ignore[union-attr]
    return names


def handler_advises(handler: ast.ExceptHandler, source: str, constants: set[str]) -> bool:
    """The handler catches import errors and raises with a ``pip install`` line."""
    caught = ast.unparse(handler.type) if handler.type is not None else "BaseException"
    if not re.search(r"ImportError|ModuleNotFoundError|Exception", caught):
        return False
    raises = [n for n in ast.walk(handler) if isinstance(n, ast.Raise) and n.exc is not None]
    text = "\n".join(ast.get_source_segment(source, r) or "" for r in raises)
    named = {n.id for r in raises for n in ast.walk(r) if isinstance(n, ast.Name)}
    return bool(raises) and (ADVICE.search(text) is not None or bool(named & constants))


def imports(path: Path) -> list[Import]:
    source = path.read_text()
    tree = ast.parse(source)
    constants = advice_strings(tree)
    found: list[Import] = []

    def visit(node: ast.AST, guarded: bool) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return
        if isinstance(node, ast.Try):
            protected = guarded or any(handler_advises(h, source, constants) for h in node.handlers)
            for child in node.body:
                visit(child, protected)
            for child in [*node.handlers, *node.orelse, *node.finalbody]:
                visit(child, guarded)
            return
        if isinstance(node, ast.Import):
            found.extend(Import(a.name, path, node.lineno, guarded) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append(Import(node.module, path, node.lineno, guarded))
        for child in ast.iter_child_nodes(node):
            visit(child, guarded)

    visit(tree, False)
    return found


def unguarded(distribution: str) -> list[str]:
    allowed = declared(distribution) | set(sys.stdlib_module_names) | {"theseus", "theseus_plugins_example"}
    src = REPO / distribution / "src"
    problems = []
    for path in sorted(src.rglob("*.py")):
        checked = CHECKED_ON_SELECTION.get(str(path.relative_to(REPO))) or CHECKED_BEFORE_IMPORT.get(
            str(path.parent.relative_to(REPO))
        )
        for found in imports(path):
            top = found.module.split(".")[0]
            if top not in allowed and not found.guarded and top != checked:
                problems.append(f"{path.relative_to(REPO)}:{found.line} imports {found.module}")
    return problems


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
def test_undeclared_imports_name_the_extra(distribution: str) -> None:
    assert unguarded(distribution) == []


def test_the_check_sees_an_unguarded_and_a_guarded_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "def a():\n    import tokenizers\n\n"
        "def b():\n    try:\n        import tiktoken\n    except ImportError as exc:\n"
        "        raise RuntimeError(\"needs tiktoken: pip install 'x[tiktoken]'\") from exc\n"
    )
    assert [(i.module, i.guarded) for i in imports(module)] == [("tokenizers", False), ("tiktoken", True)]


@pytest.mark.parametrize("sink", sorted(set(CHECKED_ON_SELECTION.values())))
def test_selecting_a_tracker_that_is_not_installed_names_the_extra(sink: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from theseus.errors import ConfigError
    from theseus.tracking.sinks import selected_sinks

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == sink else real(name, *a))
    with pytest.raises(ConfigError, match=rf"pip install 'theseus-core\[{sink}\]'"):
        selected_sinks({"metrics/sinks": f"jsonl,{sink}"})
