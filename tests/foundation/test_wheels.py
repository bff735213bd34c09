"""The four distributions build as wheels that share the ``theseus`` namespace (PEP 420)."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest

from tests.conftest import DISTRIBUTIONS, REPO, clean_env, make_venv, pip_install, run_cli

SHARED_LEVELS = {"theseus/__init__.py", "theseus/model/__init__.py", "theseus/data/__init__.py"}


@pytest.fixture(scope="session")
def wheels(wheelhouse: dict[str, Path]) -> list[Path]:
    return [wheelhouse[d] for d in DISTRIBUTIONS]


@pytest.fixture(scope="session")
def wheel_python(wheels: list[Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding the four wheels (no editable installs, no source tree on the path)."""
    python = make_venv(tmp_path_factory.mktemp("wheel-venv"), inherit="packages")
    pip_install(python, *wheels)
    return python


def test_no_wheel_ships_a_shared_namespace_level(wheels: list[Path]) -> None:
    for wheel in wheels:
        names = set(zipfile.ZipFile(wheel).namelist())
        assert not names & SHARED_LEVELS, f"{wheel.name} ships {names & SHARED_LEVELS}"
        assert any(name.endswith("entry_points.txt") for name in names), f"{wheel.name} registers nothing"


def test_a_package_several_wheels_fill_has_one_init_that_extends_its_path(wheels: list[Path]) -> None:
    """``theseus.data.datasets`` and ``theseus.data.tokenizers`` hold modules of theseus-core and of
    theseus-data; only theseus-data ships their ``__init__.py``, which must extend ``__path__`` so that
    theseus-core's modules stay importable when the two are installed in different folders."""
    filled: dict[str, set[str]] = {}
    inits: dict[str, list[tuple[str, str]]] = {}
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            for name in archive.namelist():
                if not name.endswith(".py") or ".dist-info/" in name:
                    continue
                folder = name.rpartition("/")[0]
                if name.endswith("/__init__.py"):
                    inits.setdefault(folder, []).append((wheel.name, archive.read(name).decode()))
                else:
                    filled.setdefault(folder, set()).add(wheel.name)
    shared = {folder for folder, owners in filled.items() if len(owners) > 1}
    assert {"theseus/data/datasets", "theseus/data/tokenizers"} <= shared, sorted(shared)
    for folder in shared:
        owners = inits.get(folder, [])
        assert len(owners) <= 1, f"{folder}/__init__.py is shipped by {[o for o, _ in owners]}"
        for owner, text in owners:
            assert "extend_path(__path__, __name__)" in text, f"{owner}: {folder}/__init__.py hides the other wheels"
    for folder in ("theseus/data/datasets", "theseus/data/tokenizers"):
        assert [owner.split("-")[0] for owner, _ in inits[folder]] == ["theseus_data"]


def test_no_two_wheels_ship_the_same_file(wheels: list[Path]) -> None:
    owner: dict[str, str] = {}
    for wheel in wheels:
        for name in zipfile.ZipFile(wheel).namelist():
            if ".dist-info/" in name:
                continue
            assert name not in owner, f"{name} is shipped by both {owner[name]} and {wheel.name}"
            owner[name] = wheel.name


def test_namespace_imports_from_wheels(wheel_python: Path) -> None:
    code = (
        "import theseus.model.module as m, theseus.model.models as mm, theseus.config, theseus.data.prepare\n"
        "import theseus.data.datasets.stdlib as s, theseus.data.tokenizers.byte as b\n"
        "from theseus.data.datasets import Chat, FineWeb, PythonStdlib\n"
        "from theseus.data.tokenizers import ByteTokenizer, HFTokenizer\n"
        "import sys; assert PythonStdlib.__module__ == s.__name__ and ByteTokenizer is b.ByteTokenizer\n"
        "for module in (m, mm, s, b, sys.modules[FineWeb.__module__], sys.modules[HFTokenizer.__module__]):\n"
        "    print(module.__file__)\n"
    )
    done = subprocess.run([str(wheel_python), "-c", code], capture_output=True, text=True, env=clean_env(), cwd="/")
    assert done.returncode == 0, done.stderr
    for line in done.stdout.splitlines():
        assert "site-packages" in line and str(REPO) not in line


def test_jobs_listed_from_wheels(wheel_python: Path) -> None:
    done = run_cli(["plugins"], python=wheel_python, cwd="/")
    assert done.returncode == 0, done.stderr
    for dist in DISTRIBUTIONS:
        assert dist in done.stdout
