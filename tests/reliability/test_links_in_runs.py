"""A run folder whose files are links to files elsewhere: theseus writes no file through a link. The
metrics log and the provenance record refuse in one line naming the file; the status record is left
unwritten (it must never stop a run); the file the link points to is untouched in every case."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.reliability.conftest import error_line, train_args

Cli = Callable[[list[str]], tuple[int, str]]
REFUSAL = "is a symbolic link, which theseus does not write through; move it away, or write to another name"


@pytest.mark.parametrize("name", ["metrics.jsonl", "provenance.json"])
def test_a_linked_run_file_is_one_line_and_its_target_untouched(
    cli: Cli, root: Path, tmp_path: Path, name: str
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    run = root / "runs" / "linked"
    run.mkdir(parents=True)
    (run / name).symlink_to(victim)
    code, err = cli(train_args(root, "run/name=linked"))
    assert code == 2 and error_line(err) == f"error: {str(run / name)!r} {REFUSAL}"
    assert victim.read_text() == "precious\n" and (run / name).is_symlink()


def test_a_linked_status_record_is_left_unwritten_and_the_run_trains(cli: Cli, root: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    run = root / "runs" / "linked"
    run.mkdir(parents=True)
    (run / "status.json").symlink_to(victim)
    code, err = cli(train_args(root, "run/name=linked"))
    assert code == 0, err
    assert victim.read_text() == "precious\n" and (run / "metrics.jsonl").is_file()
