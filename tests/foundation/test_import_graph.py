"""The four ``src/`` trees import each other without cycles.

The graph is read from the AST: module-level and function-local imports alike (a function-local
import only defers a cycle), without the ones under ``if TYPE_CHECKING:``. ``from pkg import name``
is an edge to ``pkg.name`` when that is a module and to ``pkg`` otherwise; a submodule's own parent
package is always initialised first and is not an edge.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import REPO

SOURCES = [REPO / d / "src" for d in ("theseus-core", "theseus-models", "theseus-data", "theseus-plugins-example")]


def modules() -> dict[str, Path]:
    found = {}
    for src in SOURCES:
        for path in src.rglob("*.py"):
            found[".".join(path.relative_to(src).with_suffix("").parts).removesuffix(".__init__")] = path
    return found


def imported(path: Path, module: str, known: dict[str, Path], typing: bool = False) -> Iterator[str]:
    """The modules of the trees that ``module`` (at ``path``) imports (``typing``: those imported under
    ``if TYPE_CHECKING:`` too)."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(child)
        for node in ast.walk(tree)
        if not typing and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for child in ast.walk(node)
    }
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def owner(name: str) -> str | None:
        parts = name.split(".")
        while parts and ".".join(parts) not in known:
            parts.pop()
        return ".".join(parts) or None

    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for name in names:
            target = owner(name)
            if target is not None and target != module and not module.startswith(target + "."):
                yield target


def graph(typing: bool = False) -> dict[str, set[str]]:
    known = modules()
    return {module: set(imported(path, module, known, typing)) for module, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def package_of(module: str) -> str:
    """``theseus.training.flywheel.loader`` -> ``theseus.training``; the ``theseus.model`` tree (core's
    ``Module`` and theseus-models' layers, models, conversions and jobs) is one layer."""
    return ".".join(module.split(".")[:2])


def test_no_module_imports_itself_through_others() -> None:
    assert cycles(graph()) == []


def test_packages_import_each_other_without_cycles() -> None:
    packages: dict[str, set[str]] = {}
    for module, targets in graph().items():
        here = package_of(module)
        packages.setdefault(here, set()).update(package_of(t) for t in targets if package_of(t) != here)
    assert cycles(packages) == []


def test_model_subpackages_import_each_other_without_cycles() -> None:
    """Within the ``theseus.model`` tree, subpackages (generation, finetune, huggingface, harness, rl,
    reward, stack, layers, models, demo, loading) import each other one way, function-local imports
    counted: opening a trained run is ``theseus.model.loading``'s, which imports none of its users."""
    packages: dict[str, set[str]] = {}
    for module, targets in graph().items():
        if not module.startswith("theseus.model."):
            continue
        here = subpackage_of(module)
        inside = {subpackage_of(t) for t in targets if t.startswith("theseus.model.")}
        packages.setdefault(here, set()).update(inside - {here})
    assert cycles(packages) == []


def subpackage_of(module: str) -> str:
    """``theseus.model.generation.decode`` -> ``theseus.model.generation``."""
    return ".".join(module.split(".")[:3])


def test_the_trainer_imports_what_it_is_built_from_one_way() -> None:
    """Even counting imports under ``if TYPE_CHECKING:``, no cycle runs through the trainer: the loop,
    ``training/init_from``, activation capture and ``model/remat=auto`` are written against
    ``theseus.training.protocol``, not ``theseus.training.base``, which imports them."""
    through_trainer = [cycle for cycle in cycles(graph(typing=True)) if "theseus.training.base" in cycle]
    assert through_trainer == []


def test_the_check_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
