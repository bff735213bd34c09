"""``metrics.jsonl`` on resume: records after the resumed step are dropped, and a run starting over from
step 0 (killed before its first checkpoint) drops everything, its step-0 validation included
(``training/eval_at_start`` logs that one again)."""

from __future__ import annotations

import json
from pathlib import Path

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
