"""``theseus new plugin NAME``: the scaffold is lint-clean, installs, lists its job and passes its tests (the
job trains on the plugin's objective, the environments play and score)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import clean_env, make_venv, pip_install, run_cli
from theseus.cli.scaffold import MAX_NAME, render_plugin

NAME = "theseus-wordcount"
FILES = [
    "README.md",
    "pyproject.toml",
    "src/theseus_wordcount/__init__.py",
    "src/theseus_wordcount/boxes.py",
    "src/theseus_wordcount/environment.py",
    "src/theseus_wordcount/hooks.py",
    "src/theseus_wordcount/objective.py",
    "src/theseus_wordcount/py.typed",
    "src/theseus_wordcount/schedule.py",
    "src/theseus_wordcount/trainer.py",
    "tests/test_theseus_wordcount.py",
    "tests/test_theseus_wordcount_boxes.py",
    "tests/test_theseus_wordcount_objective.py",
]


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, cwd=cwd, env=clean_env(), timeout=600)


@pytest.mark.slow
def test_new_plugin_installs_lists_its_job_and_passes_its_test(
    wheelhouse: dict[str, Path], tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # the templates ship in the theseus-core wheel
    python = make_venv(tmp_path_factory.mktemp("new-plugin-venv"), inherit="packages")
    pip_install(python, wheelhouse["theseus-core"], wheelhouse["theseus-models"])
    made = run_cli(["new", "plugin", NAME, "--dir", str(tmp_path / "work")], python=python, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    folder = tmp_path / "work" / NAME
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) == FILES
    assert f"created {folder} ({len(FILES)} files)" in made.stdout

    # formatted and lint-clean under the plugin's own ruff settings
    for check in (["format", "--check", "."], ["check", "."]):
        linted = run([sys.executable, "-m", "ruff", *check], folder)
        assert linted.returncode == 0, linted.stdout + linted.stderr

    # pip install ./NAME beside the core and models wheels, then theseus jobs shows the job
    pip_install(python, folder)
    jobs = run_cli(["jobs"], python=python, cwd=tmp_path)
    assert jobs.returncode == 0 and not jobs.stderr, jobs.stderr
    assert ["wordcount/train", NAME, "0.1.0"] in [line.split() for line in jobs.stdout.splitlines()]
    shown = run_cli(["plugins"], python=python, cwd=tmp_path)
    row = next(line.split() for line in shown.stdout.splitlines() if line.startswith(NAME + " "))
    assert row == [NAME, "0.1.0", ">=0.1,<0.2", "1", "5", "theseus_metrics_sinks", "ok"], shown.stdout
    assert not shown.stderr

    # the generated tests pass against the installed plugin
    tested = run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider"], folder)
    assert tested.returncode == 0, tested.stdout[-4000:] + tested.stderr[-2000:]
    assert "7 passed" in tested.stdout


@pytest.mark.parametrize("name", ["x", "a" * MAX_NAME])
def test_the_scaffold_is_lint_clean_whatever_the_length_of_its_name(name: str, tmp_path: Path) -> None:
    render_plugin(name, tmp_path)
    for check in (["format", "--check", "."], ["check", "."]):
        linted = run([sys.executable, "-m", "ruff", *check], tmp_path / name)
        assert linted.returncode == 0, linted.stdout + linted.stderr


def test_bad_names_and_existing_folders_are_refused(tmp_path: Path) -> None:
    for name, message in [
        ("Bad_Name", "error: plugin name 'Bad_Name' is not a distribution name; use lower-case letters"),
        ("theseus-core", "error: plugin name 'theseus-core' belongs to theseus itself; choose another name"),
        ("class", "error: plugin name 'class' makes the package 'class', a Python keyword"),
        ("a" * 41, "error: plugin name 'aaaa"),
    ]:
        done = run_cli(["new", "plugin", name, "--dir", str(tmp_path)], cwd=tmp_path)
        assert done.returncode == 2 and done.stderr.startswith(message), done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
    missing = run_cli(["new", "plugin"], cwd=tmp_path)
    assert missing.returncode == 2
    assert missing.stderr == "error: Missing argument 'NAME'. (see 'theseus new plugin --help')\n"
    kept = tmp_path / "taken" / "README.md"
    kept.parent.mkdir()
    kept.write_text("mine\n")
    done = run_cli(["new", "plugin", "taken", "--dir", str(tmp_path)], cwd=tmp_path)
    assert done.returncode == 2 and "already exists and is not empty" in done.stderr
    assert kept.read_text() == "mine\n" and sorted(kept.parent.iterdir()) == [kept]
