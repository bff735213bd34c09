"""The README is the front door: its distribution table is the docs' one, its test commands are what
``.ci/run`` runs, and every path and link it names exists."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from tests.conftest import REPO

README = REPO / "README.md"
TABLE = re.compile(r"^\| distribution \| what it holds \|\n\| --- \| --- \|\n((?:\|.*\|\n)+)", re.MULTILINE)


def distribution_rows(page: Path) -> list[tuple[str, str]]:
    """``(distribution, what it holds)`` of the page's distribution table."""
    found = TABLE.search(page.read_text())
    assert found is not None, f"{page.name} has no '| distribution | what it holds |' table"
    rows = []
    for line in found.group(1).splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        rows.append((cells[0].strip("`"), cells[1]))
    return rows


def section(text: str, title: str) -> str:
    found = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert found is not None, f"no section {title!r}"
    return found.group(1)


def slug(heading: str) -> str:
    """The anchor a Markdown renderer gives a heading (GitHub's rule)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_distribution_tables_agree_and_name_every_distribution() -> None:
    readme = distribution_rows(README)
    assert readme == distribution_rows(REPO / "docs" / "index.md")
    names = {tomllib.loads(p.read_text())["project"]["name"] for p in REPO.glob("theseus-*/pyproject.toml")}
    assert sorted(name for name, _ in readme) == sorted(names)


def test_ci_runs_the_readme_test_commands() -> None:
    block = re.search(r"```bash\n(.*?)```", section(README.read_text(), "Run the tests"), re.DOTALL)
    assert block is not None
    lines = [line.strip() for line in block.group(1).splitlines()]
    venv, *installs, test = [line for line in lines if line and not line.startswith("#")]
    ci = (REPO / ".ci" / "run").read_text()
    marker = '# README: "Run the tests"\n'
    assert ci.split(marker, 1)[1].split("\n")[: len(installs) + 1] == [*installs, test]
    assert installs[0] == "python -m pip install -r requirements-dev.txt"
    assert "-m venv .venv" in venv and ". .venv/bin/activate" in venv
    assert "-m venv .venv" in ci.split(marker, 1)[0] and ". .venv/bin/activate" in ci.split(marker, 1)[0]


def test_the_paths_the_readme_names_exist() -> None:
    text = README.read_text()
    named = re.findall(r"`((?:theseus-[\w-]+|tests|benchmarks|docs)/[\w./-]+)`", text)
    assert len(named) >= 8
    missing = [path for path in named if not (REPO / path).exists()]
    assert not missing


@pytest.mark.parametrize("page", [README, REPO / "benchmarks" / "README.md", REPO / "docs" / "index.md"])
def test_links_point_at_files_and_headings_that_exist(page: Path) -> None:
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if re.match(r"\w+://", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.name} links to missing {target}"
        if anchor and linked.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", linked.read_text(), re.MULTILINE)
            assert anchor in {slug(h) for h in headings}, f"{page.name} links to missing heading {target}"


def test_the_readme_stays_a_front_door() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 120
    assert "benchmarks/README.md" in section(text, "Performance")
    assert "| Figure |" not in text  # the measurements live in benchmarks/README.md
