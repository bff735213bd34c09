"""The z-loss objective: registered by entry point, selected by name, and what it trains on is the
cross-entropy of plain training plus the weighted z-loss it reports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from theseus.registry import get_registry
from theseus_plugins_example import trainers
from theseus_plugins_example.objective import ZLossCrossEntropy

WEIGHT = 0.01


def rows(root: Path, run: str, split: str) -> list[dict[str, Any]]:
    lines = (root / "runs" / run / "metrics.jsonl").read_text().splitlines()
    return [record for record in map(json.loads, lines) if record["split"] == split]


def test_registered_by_entry_point() -> None:
    entry = get_registry().component("objective", "example-z-loss")
    assert entry.distribution == "theseus-plugins-example" and entry.load() is ZLossCrossEntropy


def test_z_loss_trains_over_an_overridden_step_and_adds_to_plain_cross_entropy(
    root: Path, tiny: dict[str, Any]
) -> None:
    settings = {**tiny, "example/summary": False}
    plain = trainers.ExampleTrainer.create(root, {**settings, "run/name": "plain"})
    plain.run()
    # StepMetrics overrides train_step and val_step as the guide shows: the selected objective runs through them
    chosen = {"objective": "example-z-loss", "objective/example-z-loss/weight": WEIGHT, "run/name": "z"}
    trainer = trainers.StepMetrics.create(root, {**settings, **chosen})
    assert trainer.objective() == ZLossCrossEntropy(weight=WEIGHT)
    trainer.run()

    first, *_ = rows(root, "z", "train")
    assert first["z_loss"] > 0 and first["grad_norm_squared"] == pytest.approx(first["grad_norm"] ** 2, rel=1e-5)
    # the same initial parameters and batch: the cross-entropy term is plain training's first loss
    assert first["cross_entropy"] == pytest.approx(rows(root, "plain", "train")[0]["loss"], rel=1e-5)
    assert first["loss"] == pytest.approx(first["cross_entropy"] + WEIGHT * first["z_loss"], rel=1e-6)
    val = rows(root, "z", "val")[-1]
    # validation scores the targets' cross-entropy whatever the objective; the objective's own loss rides beside it
    assert val["loss"] == pytest.approx(val["cross_entropy"], rel=1e-5)
    objective = val["z_loss_cross_entropy_loss"]  # Objective.metric: the class name in snake case, then _loss
    assert objective == pytest.approx(val["cross_entropy"] + WEIGHT * val["z_loss"], rel=1e-5)
    assert val["valid_tokens"] == val["targets"]
