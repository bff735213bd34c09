"""The stability promise covers what the docs teach: every ``theseus`` import in the docs' code examples,
in the example plugin and in the plugin ``theseus new plugin`` writes names a module that
docs/writing-a-plugin.md lists as plugin API, and every module listed there exists."""

from __future__ import annotations

import ast
import importlib.util
import re
from string import Template

import pytest

from tests.conftest import REPO

PROMISE = REPO / "docs" / "writing-a-plugin.md"
CODE = re.compile(r"```python\n(.*?)```", re.DOTALL)
MODULE = re.compile(r"`(theseus(?:\.(?:[a-z_]+|<family>))+)`")
FAMILY = "<family>"
#: The Python templates of ``theseus new plugin``, rendered with these names.
SCAFFOLD = REPO / "theseus-core" / "src" / "theseus" / "cli" / "templates" / "plugin"
NAMES = {"dist": "theseus-acme", "package": "theseus_acme", "short": "acme", "core_range": "", "api": ""}


def promised() -> set[str]:
    """The modules of the stability promise, as the page lists them."""
    text = PROMISE.read_text()
    section = text[
        text.index("- these import paths and the public names") : text.index("- the trainer's override contract")
    ]
    return set(MODULE.findall(section))


def is_promised(module: str, listed: set[str]) -> bool:
    if module in listed:
        return True
    parts = module.split(".")
    return any(
        FAMILY in entry
        and len(entry.split(".")) == len(parts)
        and all(want in (got, FAMILY) for want, got in zip(entry.split("."), parts, strict=True))
        for entry in listed
    )


def theseus_imports(code: str) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
        elif isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
    return {name for name in modules if name == "theseus" or name.startswith("theseus.")}


def taught() -> dict[str, set[str]]:
    """``{module: where}`` for every theseus import in the docs' examples, the example plugin and the scaffold."""
    found: dict[str, set[str]] = {}
    sources = [
        (page.name, block) for page in sorted((REPO / "docs").rglob("*.md")) for block in CODE.findall(page.read_text())
    ]
    sources += [
        (path.name, path.read_text()) for path in sorted((REPO / "theseus-plugins-example" / "src").rglob("*.py"))
    ]
    sources += [
        (path.name, Template(path.read_text()).substitute(NAMES)) for path in sorted(SCAFFOLD.rglob("*.py.tmpl"))
    ]
    for where, code in sources:
        for module in theseus_imports(code):
            found.setdefault(module, set()).add(where)
    return found


def test_every_import_the_docs_teach_is_promised() -> None:
    listed = promised()
    outside = {module: sorted(where) for module, where in taught().items() if not is_promised(module, listed)}
    assert not outside, f"imported in examples but not in the stability promise of {PROMISE.name}: {outside}"


@pytest.mark.parametrize("module", sorted(promised()))
def test_every_promised_module_exists(module: str) -> None:
    if FAMILY in module:
        module = module.replace(FAMILY, "gpt")
    assert importlib.util.find_spec(module) is not None, f"{PROMISE.name} promises {module}, which does not exist"


def test_the_promise_reads_as_a_list_of_modules() -> None:
    listed = promised()
    assert {"theseus.rl.environment", "theseus.base.logprobs", "theseus.training.objective"} <= listed
    assert is_promised("theseus.model.models.llama.hf", listed) and not is_promised("theseus.model.stack.scan", listed)
