"""The example plugin's README says what the installed distribution registers: the counts its
``theseus plugins`` line shows, every entry point's name, and a row for every module of the package."""

from __future__ import annotations

import re
import tomllib

import pytest

from tests.conftest import REPO
from tests.reliability.conftest import call_cli

FOLDER = REPO / "theseus-plugins-example"
DIST = "theseus-plugins-example"
#: The README's comment on ``theseus plugins``: ``theseus-plugins-example: 5 jobs, 16 components, 3 hooks``.
COUNTS = re.compile(rf"theseus plugins\s+# {DIST}: (\d+) jobs, (\d+) components, (\d+) hooks")


def test_the_counts_are_what_theseus_plugins_shows(capsys: pytest.CaptureFixture[str]) -> None:
    said = COUNTS.search((FOLDER / "README.md").read_text())
    assert said is not None, "the README's `theseus plugins` line gives no counts"
    capsys.readouterr()
    assert call_cli(["plugins"]) == 0
    row = next(line.split() for line in capsys.readouterr().out.splitlines() if line.startswith(DIST + " "))
    jobs, components, hooks = row[3], row[4], [hook.strip(",") for hook in row[5:-1]]
    assert said.groups() == (jobs, components, str(len(hooks))), row


def test_every_entry_point_and_module_has_its_row() -> None:
    readme = (FOLDER / "README.md").read_text()
    entry_points = tomllib.loads((FOLDER / "pyproject.toml").read_text())["project"]["entry-points"]
    names = [name for group in entry_points.values() for name in group]
    assert len(names) >= 20 and not [name for name in names if f"`{name}`" not in readme]
    package = FOLDER / "src" / "theseus_plugins_example"
    modules = sorted(path.name for path in package.glob("*.py") if path.name != "__init__.py")
    assert not [name for name in modules if f"`{name}`" not in readme]
