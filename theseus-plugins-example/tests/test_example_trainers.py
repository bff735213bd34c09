"""The example's jobs: registered by entry point, and each variation has its documented effect."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

from theseus.registry import get_registry
from theseus_plugins_example import trainers
from theseus_plugins_example.analysis import PredictionEntropy

JOBS = {
    "example/gpt/train": trainers.ExampleTrainer,
    "example/gpt/ignore-first-target": trainers.IgnoreFirstTarget,
    "example/gpt/logit-rms": trainers.LogitRMS,
    "example/gpt/step-metrics": trainers.StepMetrics,
    "example/gpt/deterministic-inspection": trainers.DeterministicInspection,
}


def test_jobs_are_registered_by_entry_point() -> None:
    registry = get_registry()
    for name, cls in JOBS.items():
        assert registry.load_job(name) is cls
        assert registry.job(name).distribution == "theseus-plugins-example"


class Everything(trainers.DeterministicInspection, trainers.IgnoreFirstTarget, trainers.StepMetrics, trainers.LogitRMS):
    """The four variations at once, so that the tiny model compiles once per step function."""


def records(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_variations_train_measure_and_write_csv(
    root: Path, tiny: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    trainer = Everything.create(root, tiny)
    assert trainer.setting("architecture/vocab_size") == 257  # raised from the generic 256 for bytes
    trainer.run()
    run_dir = root / "runs" / "Everything"
    found = records(run_dir)
    train = [r for r in found if r["split"] == "train"]
    val, evaluation, analysis = ([r for r in found if r["split"] == s][-1] for s in ("val", "eval", "analysis"))
    assert [r["step"] for r in train] == [1, 2]
    for row in train:  # StepMetrics and LogitRMS
        assert row["grad_norm_squared"] == pytest.approx(row["grad_norm"] ** 2, rel=1e-5)
        assert row["logit_rms"] > 0
    # IgnoreFirstTarget: 4 rows x 31 counted targets, in validation and in the evaluation
    assert val["valid_tokens"] == val["targets"] == 4 * 31 and val["logit_rms"] > 0
    assert evaluation["next_token/targets"] == 4 * 31
    assert 0.0 <= evaluation["next_token/accuracy"] <= evaluation["next_token/top5"] <= 1.0
    # the analysis: one CSV row per position; position 0 has no counted target
    table = list(csv.DictReader((run_dir / "analysis" / "entropy" / "step_00000002.csv").open()))
    assert [int(r["position"]) for r in table] == list(range(32))
    assert table[0]["rows"] == "0" and table[0]["entropy"] == "" and all(r["rows"] == "4" for r in table[1:])
    assert 0.0 < analysis["entropy/mean"] <= np.log(257) + 1e-6
    assert analysis["entropy/loss"] == pytest.approx(val["loss"], rel=1e-5)  # deterministic trace = validation
    # the CSV sink received every record
    with (run_dir / "metrics.csv").open() as handle:
        sunk = {(int(r["step"]), r["name"]): float(r["value"]) for r in csv.DictReader(handle)}
    assert sunk[(2, "train/loss")] == pytest.approx(train[-1]["loss"])
    assert sunk[(2, "val/valid_tokens")] == 4 * 31
    assert sunk[(2, "eval/next_token/accuracy")] == pytest.approx(evaluation["next_token/accuracy"])
    assert sunk[(2, "analysis/entropy/mean")] == pytest.approx(analysis["entropy/mean"])
    assert f"Everything: step 2/2; val loss {val['loss']:.4f}" in capsys.readouterr().out

    # DeterministicInspection: the analysis does not depend on the step's dropout key
    state = trainer.state
    again = PredictionEntropy().analyze(trainer, state, 7, root / "again")
    assert again is not None and again["mean"] == pytest.approx(analysis["entropy/mean"], rel=1e-6)
    batch = trainer.sharding.put_batch(trainer.host_batch("val", position=0))
    first = trainer.trace_fn()(state, batch, jax.random.PRNGKey(1))[0]
    second = trainer.trace_fn()(state, batch, jax.random.PRNGKey(2))[0]
    np.testing.assert_array_equal(np.asarray(first), np.asarray(second))


def test_missing_data_is_one_clear_error(tmp_path: Path, tiny: dict[str, Any]) -> None:
    from theseus.errors import DataError

    with pytest.raises(DataError, match="theseus run data/tokenize") as failure:
        trainers.ExampleTrainer.create(tmp_path, tiny).run()
    assert "python-stdlib" in str(failure.value) and "\n" not in str(failure.value)
