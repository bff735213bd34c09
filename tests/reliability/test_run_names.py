"""A run name is one folder name under ``<root>/runs``: a path, ``.``/``..``, a leading ``-`` or an
overlong name is one line and exit 2, before anything is prepared or written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import run_cli
from theseus.errors import ConfigError
from theseus.runs.layout import MAX_RUN_NAME, check_run_name, run_path

BAD = {
    "/tmp/elsewhere": "contains a path separator",
    "a/b": "contains a path separator",
    "..": "is not a folder name",
    ".": "is not a folder name",
    "-x": "starts with '-'",
    "x" * 300: f"is 300 bytes long in UTF-8 (at most {MAX_RUN_NAME})",
    "\U0001f600"
    * MAX_RUN_NAME: f"is {4 * MAX_RUN_NAME} bytes long in UTF-8 (at most {MAX_RUN_NAME})",  # 128 characters
    "tab\there": "contains a control character",
}


def test_run_names_are_folder_names() -> None:
    for name in ("my-run-1", "lr=3e-4", "run.v2_final", "x" * MAX_RUN_NAME, "ünïcode", "\U0001f600" * 32):
        assert check_run_name(name) == name
    for name, problem in BAD.items():
        with pytest.raises(ConfigError, match=re.escape(problem)):
            run_path("/root", name)


@pytest.mark.parametrize("name", ["/tmp/elsewhere", "..", ".", "-x", "x" * 300, "\U0001f600" * MAX_RUN_NAME])
def test_a_bad_run_name_is_one_line_and_writes_nothing(tmp_path: Path, name: str) -> None:
    root = tmp_path / "root"
    done = run_cli(["run", "train/pretrain", f"run/name={name}", "--root", str(root)])
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: run/name=") and BAD[name] in done.stderr, done.stderr
    assert done.stderr.strip().count("\n") == 0
    assert not root.exists()
