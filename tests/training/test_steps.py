"""The jitted update: gradient accumulation, non-finite handling, dropout keys."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

from tests.training.conftest import quick
from tests.training.tiny import PaddedTinyTrainer
from theseus.training.optimizers import SGD


class SGDTrainer(PaddedTinyTrainer):
    """Plain SGD without clipping: the update is exactly ``-lr * gradient``."""

    OPTIMIZER = SGD


def test_accumulating_micro_batches_equals_one_large_batch(tmp_path) -> None:
    # k=4 micro-batches of 2 rows (from the configuration) vs one batch of 8 rows (the classmethod
    # called with accumulate_steps=1); rows carry different amounts of padding.
    trainer = SGDTrainer.create(
        tmp_path,
        quick(
            training__batch_size=8,
            training__micro_batch_size=2,
            training__grad_clip=0.0,
            training__lr=0.5,
            **{"optimizer/sgd/momentum": 0.0},
        ),
    )
    trainer.setup()
    assert trainer.accumulate_steps == 4
    state = trainer.init_state()
    initial = jax.device_get(state.params)
    host = trainer.host_batch("train", position=0)
    key = trainer.step_key(0)
    whole_step = jax.jit(
        functools.partial(
            SGDTrainer.train_step, accumulate_steps=1, sharding=trainer.sharding, objective=trainer.objective()
        )
    )
    whole_state, loss_1, _meta, _norm = whole_step(state, {k: v[None] for k, v in host.items()}, key)
    whole = jax.device_get(whole_state.params)
    accumulated_state, loss_k, *_ = trainer.train_step_fn()(state, trainer.device_train_batch(host), key)
    accumulated = jax.device_get(accumulated_state.params)

    assert float(loss_k) == pytest.approx(float(loss_1), abs=1e-5)
    for a, b in zip(jax.tree.leaves(accumulated), jax.tree.leaves(whole), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    pairs = zip(jax.tree.leaves(whole), jax.tree.leaves(initial), strict=True)
    moved = max(float(np.abs(a - b).max()) for a, b in pairs)
    assert moved > 1e-3  # the update is not trivially zero


def test_the_step_lowered_and_compiled_ahead_runs_as_the_step_does(tmp_path) -> None:
    """``train_step_fn().lower(...).compile()`` (benchmarks and plans compile ahead) gives a program that
    takes the step's own arguments, the objective's arrays added as the step adds them."""
    trainer = SGDTrainer.create(tmp_path, quick())
    trainer.setup()
    batch, key = trainer.device_train_batch(trainer.host_batch("train", position=0)), trainer.step_key(0)
    fn = trainer.train_step_fn()
    compiled = fn.lower(trainer.init_state(), batch, key).compile()
    assert "HloModule" in compiled.as_text()  # jax's own stage, passed through
    ahead = compiled(trainer.init_state(), batch, key)[1]
    assert float(ahead) == float(fn(trainer.init_state(), batch, key)[1])


class Exploding(PaddedTinyTrainer):
    """From the second update on, batches have no real tokens and the loss is NaN."""

    def batch(self, slice: str = "train"):
        batch = super().batch(slice)
        if slice == "train" and self.position(slice) >= 1:
            batch["padding_mask"] = np.zeros_like(batch["padding_mask"])
        return batch

    @staticmethod
    def forward(state, params, batch, key=None, deterministic=False, intermediates=False):
        logits, loss, meta = PaddedTinyTrainer.forward(state, params, batch, key, deterministic, intermediates)
        bad = jax.numpy.sum(batch["padding_mask"]) == 0
        return logits, jax.numpy.where(bad, jax.numpy.nan, loss), meta


def test_nonfinite_loss_stops_with_step_and_quantity(tmp_path) -> None:
    from theseus.errors import TrainingError

    trainer = Exploding.create(tmp_path, quick(training__steps=4, training__checkpoint_interval=1))  # fmt: skip
    with pytest.raises(TrainingError, match=r"non-finite loss \(nan\) at step 2"):
        trainer.run()
    checkpoints = sorted(p.name for p in (tmp_path / "runs" / trainer.run_name / "checkpoints").iterdir())
    assert checkpoints == ["1"]  # the last good checkpoint is kept, nothing after it


def test_skip_nonfinite_keeps_parameters_and_counts(tmp_path) -> None:
    trainer = Exploding.create(tmp_path, quick(training__steps=3, training__skip_nonfinite=True))
    trainer.run()
    import json

    rows = [json.loads(x) for x in (tmp_path / "runs" / trainer.run_name / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["split"] == "train"]
    assert [r["skipped_steps"] for r in train] == [0, 1, 2]
    assert [r["skipped"] for r in train] == [0, 1, 1]


def test_dropout_key_is_a_function_of_seed_and_step(tmp_path) -> None:
    a = PaddedTinyTrainer.create(tmp_path, quick())
    b = PaddedTinyTrainer.create(tmp_path, quick())
    a.setup(), b.setup()
    assert np.array_equal(jax.random.key_data(a.step_key(5)), jax.random.key_data(b.step_key(5)))
    assert not np.array_equal(jax.random.key_data(a.step_key(5)), jax.random.key_data(a.step_key(6)))
