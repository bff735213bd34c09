"""The early-stop loop callback that ``hooks.py`` adds through ``theseus_callbacks``: a run of the
example's job from the command line ends, with exit code 0 and a checkpoint, at the validation
where the loss crossed the threshold."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from theseus.config import Schema
from theseus.errors import ConfigError
from theseus.training.pretrain import Pretrain
from theseus_plugins_example.callbacks import EarlyStop
from theseus_plugins_example.hooks import EarlyStopConfig
from theseus_plugins_example.trainers import ExampleTrainer


def records(run_dir: Path, split: str) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["split"] == split]


def test_the_section_and_callback_come_with_opted_in_trainers_only(root: Path, tiny: dict[str, Any]) -> None:
    assert EarlyStopConfig in ExampleTrainer.config()
    assert "early_stop/metric" not in Schema.build(Pretrain.config())
    assert ExampleTrainer.create(root, tiny).callbacks() == []  # not a declaration: it comes from the hook
    with pytest.raises(ConfigError, match="early_stop/split"):
        ExampleTrainer.create(root, {**tiny, "early_stop/metric": "loss", "early_stop/split": "test"})


def test_a_run_stops_at_the_validation_that_crosses_the_threshold(root: Path, tiny: dict[str, Any]) -> None:
    settings = {**tiny, "training/steps": 8, "training/eval_interval": 2, "example/summary": False}
    reference = ExampleTrainer.create(root, {**settings, "run/name": "reference"})
    reference.run()
    val = {r["step"]: r["loss"] for r in records(root / "runs" / "reference", "val")}
    assert sorted(val) == [2, 4, 6, 8]
    threshold = val[4]
    expected = min(step for step, loss in val.items() if loss <= threshold)  # 4, or 2 if that was lower still

    args = [f"{key}={value}" for key, value in settings.items() if key != "example/summary"]
    args += ["run/name=early", "early_stop/metric=loss", f"early_stop/below={threshold!r}"]
    done = subprocess.run(
        [sys.executable, "-m", "theseus.cli.main", "run", "example/gpt/train", *args, "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    run_dir = root / "runs" / "early"
    assert f"trained 'early' to step {expected}/8" in done.stderr
    assert f"stopped: val/loss {val[expected]:.4f} at step {expected} is at or below early_stop/below=" in done.stderr
    assert f"early: step {expected}/8; val loss" in done.stdout  # the example's own summary line
    assert [r["step"] for r in records(run_dir, "train")] == list(range(1, expected + 1))
    assert [r["step"] for r in records(run_dir, "val")] == list(range(2, expected + 1, 2))
    assert sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit()) == [expected]


class Info:
    """The parts of a ``StepInfo`` the callback reads, on the ``step`` event of update 5."""

    event, step, metrics_step, metrics, validation = "step", 5, 4, {"loss": 2.0}, None

    def __init__(self) -> None:
        self.stopped: list[str] = []
        self.messages: list[str] = []

    def stop(self, reason: str) -> None:
        self.stopped.append(reason)

    def message(self, text: str) -> None:
        self.messages.append(text)


def test_a_training_metric_is_read_as_it_arrives() -> None:
    info = Info()
    EarlyStop("loss", 2.5, split="train")(info)  # type: ignore[arg-type]
    EarlyStop("loss", 2.5)(info)  # type: ignore[arg-type]  # validation metrics: not on this event
    assert info.stopped == ["train/loss 2.0000 at step 4 is at or below early_stop/below=2.5"]
    misspelt = EarlyStop("los", 2.5, split="train")
    misspelt(info)  # type: ignore[arg-type]
    info.event = "end"
    misspelt(info)  # type: ignore[arg-type]
    assert info.messages == ["warning: early_stop/metric 'los' never appeared in the train metrics"]
