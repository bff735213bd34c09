"""Every Python code block in docs/ runs (doc examples never rot).

The blocks of one page run in order in one namespace, in a fresh working directory, so a
page can build on its earlier examples. A block preceded by ``<!-- doc-test: skip -->``
is not run (reserved for blocks that need a GPU or a cluster).
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

from tests.conftest import REPO

DOCS = REPO / "docs"
BLOCK = re.compile(r"(<!-- doc-test: skip -->\s*)?```python\n(.*?)```", re.DOTALL)


def python_blocks(page: Path) -> list[str]:
    return [code for skip, code in BLOCK.findall(page.read_text()) if not skip]


PAGES = sorted(p for p in DOCS.rglob("*.md") if python_blocks(p))


def test_docs_have_examples() -> None:
    assert len(PAGES) >= 1


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_page_examples_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("THESEUS_ROOT", str(tmp_path / "root"))
    # The blocks run like one script: a real module (dataclasses look their module up) compiled
    # without this file's ``from __future__`` flags.
    module = types.ModuleType(f"doc_{page.stem.replace('-', '_')}")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    namespace = module.__dict__
    for index, code in enumerate(python_blocks(page)):
        try:
            exec(compile(code, f"{page.name}[block {index}]", "exec", dont_inherit=True), namespace)
        except Exception as exc:  # pragma: no cover - the failure message is the point
            pytest.fail(f"{page.relative_to(DOCS)} block {index} failed: {type(exc).__name__}: {exc}\n{code}")
