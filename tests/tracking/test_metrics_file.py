"""``metrics.jsonl`` on resume: records after the resumed step are dropped, and a run starting over from
step 0 (killed before its first checkpoint) drops everything, its step-0 validation included
(``training/eval_at_start`` logs that one again). A line whose step is no count is kept and skipped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from theseus.runs.records import read_metrics
from theseus.training.metrics import MetricsLogger


def write(path: Path, steps: list[tuple[int, str]]) -> None:
    path.write_text("".join(json.dumps({"step": s, "split": split, "loss": 1.0}) + "\n" for s, split in steps))


def test_resume_keeps_records_up_to_the_resumed_step(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    write(path, [(0, "val"), (1, "train"), (2, "train"), (2, "val"), (3, "train")])
    MetricsLogger(path, resume_step=2).close()
    assert [(r["step"], r["split"]) for r in map(json.loads, path.read_text().splitlines())] == [
        (0, "val"),
        (1, "train"),
        (2, "train"),
        (2, "val"),
    ]


def test_starting_over_from_step_0_logs_step_0_once(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    write(path, [(0, "val"), (1, "train")])
    logger = MetricsLogger(path, resume_step=0)
    logger.log(0, "val", {"loss": 2.0})
    logger.close()
    assert [json.loads(line)["loss"] for line in path.read_text().splitlines()] == [2.0]
    assert logger.history["val"] == [(0, 2.0)]


def test_a_record_log_is_cut_back_on_resume_and_appends_valid_json(tmp_path: Path) -> None:
    """``RecordLog`` (``rollouts.jsonl``) is written as ``metrics.jsonl`` is: cut back to the resumed step (a
    line cut short by a crash dropped), each write appended as JSON lines, a non-finite number as its text;
    a log of another process writes nothing."""
    from theseus.training.metrics import RecordLog

    path = tmp_path / "rollouts.jsonl"
    path.write_text("".join(json.dumps({"step": s, "index": 0}) + "\n" for s in (1, 2, 3)) + '{"step": 4, "ind')
    RecordLog(tmp_path / "other.jsonl", resume_step=2, enabled=False).write([{"step": 3}])
    assert not (tmp_path / "other.jsonl").exists()
    log = RecordLog(path, resume_step=2)
    log.write([{"step": 3, "reward": float("nan"), "turns": [{"content": "a\nb"}]}])
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert records == [
        {"step": 1, "index": 0},
        {"step": 2, "index": 0},
        {"step": 3, "reward": "nan", "turns": [{"content": "a\nb"}]},
    ]


def test_a_step_that_is_no_count_is_kept_on_resume_and_skipped_when_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``{"step": 1e400}`` (infinity to JSON) once broke resume with an OverflowError; a step that is no
    count is treated like a line that is not UTF-8: kept as it is on resume, skipped when read, one warning."""
    path = tmp_path / "metrics.jsonl"
    write(path, [(1, "train"), (2, "train"), (3, "train")])
    bad = ['{"step": 1e400, "split": "train", "loss": 1}', '{"step": "x"}', '{"step": true}', '{"step": -1}']
    path.write_text(path.read_text() + "".join(line + "\n" for line in bad) + '{"step": ' + "[" * 100_000 + "\n")
    MetricsLogger(path, resume_step=2).close()
    assert path.read_text().splitlines() == [
        json.dumps({"step": 1, "split": "train", "loss": 1.0}),
        json.dumps({"step": 2, "split": "train", "loss": 1.0}),
        *bad,  # the line nested past the parser's depth is dropped, like a line cut short
    ]
    warning = f"warning: {path}:4: step inf is not a step count; skipped that line (and 3 more lines)\n"
    assert capsys.readouterr().err == warning
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    assert capsys.readouterr().err == warning.replace(":4:", ":3:")  # the file as resume rewrote it
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    assert capsys.readouterr().err == ""  # each line is warned about once per process
