"""Every example of extend-a-trainer.md runs verbatim and has the effect the guide describes.

The examples are checked one by one on a custom-batch trainer (``DATASET = []``) whose batches
contain padding, and together on the guide's own ``MyTrainer`` (GPT + ``Sampling(FineWeb, 1.0,
"pmd")`` on data prepared in a temporary root), combined into one class to compile GPT once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

from tests.training.conftest import quick
from tests.training.spec_examples import examples
from tests.training.tiny import PaddedTinyTrainer
from theseus.plugins import hookimpl, plugins, register_hooks

#: A one-layer, 32-wide GPT on byte tokens keeps compilation short.
GPT_SMALL = {
    "architecture/preset": "tiny",
    "architecture/n_layers": 1,
    "architecture/n_embd": 32,
    "architecture/n_heads": 2,
    "architecture/vocab_size": 257,
    "architecture/block_size": 32,
    "training/batch_size": 4,
}

EXAMPLES = examples(PaddedTinyTrainer)


def records(trainer: Any, split: str) -> list[dict[str, Any]]:
    path = trainer.context.root / "runs" / trainer.run_name / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in rows if r["split"] == split]


def log_probs(logits: Any) -> np.ndarray:
    logits = np.asarray(logits, np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def hand_losses(logits: Any, batch: dict[str, np.ndarray]) -> tuple[float, float]:
    """Mean cross-entropy over the real targets, and over those without position 0."""
    y, mask = batch["y"], batch["padding_mask"]
    picked = np.take_along_axis(log_probs(logits), np.maximum(y, 0)[..., None], -1)[..., 0]
    real = (y != -1) & mask
    without_first = real.copy()
    without_first[:, 0] = False
    return float(-picked[real].mean()), float(-picked[without_first].mean())


def test_ignore_first_target_drops_position_zero_from_the_loss(tmp_path: Path) -> None:
    ignore = EXAMPLES["IgnoreFirstTarget"].create(tmp_path, quick())
    plain = PaddedTinyTrainer.create(tmp_path, quick())
    state = plain.init_state()

    original = plain.host_batch("val", position=0)
    changed = ignore.host_batch("val", position=0)
    assert (changed["y"][:, 0] == -1).all() and (original["y"][:, 0] != -1).all()
    np.testing.assert_array_equal(changed["y"][:, 1:], original["y"][:, 1:])

    loss_sum, count, _meta = ignore.val_step_fn()(state, ignore.sharding.put_batch(changed))
    ignore_loss = float(loss_sum) / float(count)
    logits = jax.jit(lambda s, b: type(plain).forward(s, s.params, b, deterministic=True)[0])(
        state, plain.sharding.put_batch(original)
    )
    base_loss, without_first = hand_losses(logits, original)
    assert ignore_loss == pytest.approx(without_first, rel=1e-5)
    assert abs(ignore_loss - base_loss) > 1e-4


def test_logit_rms_reaches_the_metrics(tmp_path: Path) -> None:
    trainer = EXAMPLES["LogitRMS"].create(tmp_path, quick(training__steps=2, training__eval_batches=1))
    trainer.run()
    train, val = records(trainer, "train"), records(trainer, "val")
    assert [r["step"] for r in train] == [1, 2] and all(r["logit_rms"] > 0 for r in train)
    # The validation value is the RMS of the deterministic logits of the validation batch.
    batch = trainer.sharding.put_batch(trainer.host_batch("val", position=0))
    logits = jax.jit(lambda s, b: type(trainer).forward(s, s.params, b, deterministic=True)[0])(trainer.state, batch)
    expected = float(np.sqrt(np.mean(np.asarray(logits, np.float64) ** 2)))
    assert val[-1]["logit_rms"] == pytest.approx(expected, rel=1e-4)


class RecordingSink:
    def __init__(self) -> None:
        self.writes: list[tuple[int, dict[str, Any]]] = []
        self.closed = False

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        self.writes.append((step, metrics))

    def close(self) -> None:
        self.closed = True


class SinkPlugin:
    def __init__(self) -> None:
        self.sink = RecordingSink()
        self.runs: list[Path] = []

    @hookimpl
    def theseus_metrics_sinks(self, run_dir: Path, job: Any) -> list[Any]:
        self.runs.append(run_dir)
        return [self.sink]


def test_step_metrics_extend_train_and_val_metadata(tmp_path: Path) -> None:
    trainer = EXAMPLES["StepMetrics"].create(tmp_path, quick(training__steps=2, training__eval_batches=1))
    plugin = SinkPlugin()
    register_hooks(plugin, name="test-training-sink")
    try:
        trainer.run()
    finally:
        plugins().manager.unregister(name="test-training-sink")
    train, val = records(trainer, "train"), records(trainer, "val")
    # Metrics-sink plugins receive the same numbers, named <split>/<metric>, and are closed.
    assert plugin.runs == [tmp_path / "runs" / trainer.run_name] and plugin.sink.closed
    sunk = {(step, name): value for step, metrics in plugin.sink.writes for name, value in metrics.items()}
    assert sunk[(2, "train/grad_norm_squared")] == train[-1]["grad_norm_squared"]
    assert sunk[(2, "val/valid_tokens")] == val[-1]["valid_tokens"]
    assert len(train) == 2
    for row in train:
        assert row["grad_norm_squared"] == pytest.approx(row["grad_norm"] ** 2, rel=1e-5)
    host = trainer.host_batch("val", position=0)
    expected = int(((host["y"] != -1) & host["padding_mask"]).sum())
    assert expected < host["y"].size  # the batch has padding
    assert val[-1]["valid_tokens"] == expected == val[-1]["targets"]


def test_deterministic_inspection_ignores_the_key(tmp_path: Path) -> None:
    overrides = quick(**{"architecture/dropout": 0.5})
    inspection = EXAMPLES["DeterministicInspection"].create(tmp_path, overrides)
    plain = PaddedTinyTrainer.create(tmp_path, overrides)
    state = plain.init_state()
    batch = plain.sharding.put_batch(plain.host_batch("val", position=0))
    k1, k2 = jax.random.PRNGKey(1), jax.random.PRNGKey(2)

    logits1, loss1, _ = inspection.trace_fn()(state, batch, k1)
    logits2, loss2, _ = inspection.trace_fn()(state, batch, k2)
    np.testing.assert_array_equal(np.asarray(logits1), np.asarray(logits2))
    assert float(loss1) == float(loss2)
    # The base trace keeps dropout on, so there the key matters.
    base1, base2 = plain.trace_fn()(state, batch, k1), plain.trace_fn()(state, batch, k2)
    assert not np.array_equal(np.asarray(base1[0]), np.asarray(base2[0]))
    assert "intermediates" in base1[2]


def test_guide_examples_on_gpt_and_fineweb(fineweb_root: Path, tmp_path: Path) -> None:
    from tests.training.spec_mytrainer import MyTrainer

    guide = examples(MyTrainer)

    class Everything(
        guide["DeterministicInspection"], guide["IgnoreFirstTarget"], guide["StepMetrics"], guide["LogitRMS"]
    ):
        """All four examples at once: one GPT compilation per step function."""

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "fineweb").symlink_to(fineweb_root / "data" / "fineweb")
    trainer = Everything.create(
        tmp_path, quick(**GPT_SMALL, training__steps=2, training__eval_batches=1, **{"architecture/dropout": 0.5})
    )
    trainer.run()
    train, val = records(trainer, "train"), records(trainer, "val")
    for row in train:  # StepMetrics and LogitRMS on the training step
        assert row["grad_norm_squared"] == pytest.approx(row["grad_norm"] ** 2, rel=1e-5)
        assert row["logit_rms"] > 0
    # IgnoreFirstTarget reaches validation: 4 rows x 31 learned targets (FineWeb "pmd" rows have no padding).
    assert val[-1]["valid_tokens"] == 4 * 31 and val[-1]["logit_rms"] > 0

    batch = trainer.host_batch("val", position=0)
    assert (batch["y"][:, 0] == -1).all()
    on_mesh = trainer.sharding.put_batch(batch)
    logits1, loss1, meta1 = trainer.trace_fn()(trainer.state, on_mesh, jax.random.PRNGKey(1))
    logits2, loss2, meta2 = trainer.trace_fn()(trainer.state, on_mesh, jax.random.PRNGKey(2))
    np.testing.assert_array_equal(np.asarray(logits1), np.asarray(logits2))  # DeterministicInspection
    assert float(loss1) == float(loss2) and float(meta1["logit_rms"]) == float(meta2["logit_rms"])
    original = MyTrainer.batch(trainer, "val")  # the guide's batch before IgnoreFirstTarget changed it
    assert (original["y"][:, 0] != -1).all()
    base_loss, without_first = hand_losses(logits1, original)
    assert float(loss1) == pytest.approx(without_first, rel=1e-5) and abs(base_loss - without_first) > 1e-4
    assert val[-1]["loss"] == pytest.approx(without_first, rel=1e-5)
