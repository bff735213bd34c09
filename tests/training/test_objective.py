"""Objectives: the one train step runs the objective a trainer declares, an override of ``train_step`` /
``val_step`` with the guide's signatures runs it unchanged, objectives are selected by registered name,
and the step computes exactly what an objective reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest

from tests.tolerances import float32_tolerance, model_ops, transformer_ops
from tests.training.conftest import quick
from tests.training.spec_examples import examples
from tests.training.tiny import PaddedTinyTrainer
from theseus.errors import ConfigError, DataError
from theseus.training import steps
from theseus.training.objective import CrossEntropy, Needs, Objective, Scores, current, using


class HalfCrossEntropy(Objective):
    """Half the model's own cross-entropy: every gradient exactly halved (a power of two)."""

    def __call__(self, scores: Scores, batch: Any) -> tuple[jax.Array, dict[str, Any]]:
        return 0.5 * scores.loss, {"halved": jnp.float32(1.0)}


class ReadsAdvantages(Objective):
    """Declares a batch entry the tiny trainer's batches do not have."""

    needs = Needs("target_logps", batch=("advantages",))

    def __call__(self, scores: Scores, batch: Any) -> tuple[jax.Array, dict[str, Any]]:
        return jnp.sum(scores.logps * batch["advantages"][:, None]), {}


StepMetrics = examples(PaddedTinyTrainer)["StepMetrics"]


class HalfStepMetrics(StepMetrics):  # type: ignore[misc, valid-type]
    """The guide's ``train_step`` / ``val_step`` override over a declared objective."""

    OBJECTIVE = HalfCrossEntropy


def first_update(trainer: Any, state: Any) -> tuple[float, float, dict[str, Any]]:
    host = trainer.host_batch("train", position=0)
    _state, loss, meta, grad_norm, _lr = trainer.train_step_fn()(
        state, trainer.device_train_batch(host), trainer.step_key(0)
    )
    return float(loss), float(grad_norm), {name: float(value) for name, value in jax.device_get(meta).items()}


def test_an_override_of_train_step_and_val_step_runs_the_declared_objective(tmp_path: Path) -> None:
    plain = StepMetrics.create(tmp_path, quick(training__micro_batch_size=4))
    half = HalfStepMetrics.create(tmp_path, quick(training__micro_batch_size=4))
    assert isinstance(half.objective(), HalfCrossEntropy) and isinstance(plain.objective(), CrossEntropy)
    plain_loss, plain_norm, plain_meta = first_update(plain, plain.init_state())  # the state is donated
    half_loss, half_norm, half_meta = first_update(half, half.init_state())  # the same parameters (seed)
    assert half.accumulate_steps == 2  # accumulated micro-batches, weighted by their targets
    # two programs, each free to order the tiny model's forward and backward passes its own way
    model = plain.model
    rel = float32_tolerance(3 * transformer_ops(1, model.width, model.block_size, model.vocab_size))
    assert half_loss == pytest.approx(0.5 * plain_loss, rel=rel)
    assert half_norm == pytest.approx(0.5 * plain_norm, rel=rel)
    assert half_meta["halved"] == 1.0 and "halved" not in plain_meta
    assert half_meta["grad_norm_squared"] == pytest.approx(half_norm**2, rel=rel)  # the override's metric

    batch = plain.sharding.put_batch(plain.host_batch("val", position=0))
    plain_sum, plain_count, _ = plain.val_step_fn()(plain.init_state(), batch)
    half_sum, half_count, meta = half.val_step_fn()(half.init_state(), batch)
    assert int(half_count) == int(plain_count) == int(meta["valid_tokens"])
    assert float(half_sum) == pytest.approx(0.5 * float(plain_sum), rel=rel)


def test_outside_a_trainer_the_step_runs_cross_entropy() -> None:
    assert isinstance(current(), CrossEntropy)
    with using(HalfCrossEntropy()) as goal:
        assert current() is goal
    assert isinstance(current(), CrossEntropy)


def test_objectives_are_selected_by_registered_name(tmp_path: Path) -> None:
    chosen = PaddedTinyTrainer.create(tmp_path, quick(objective="cross_entropy"))
    assert isinstance(chosen.objective(), CrossEntropy)
    assert chosen.setting("select/objective") == "cross_entropy"
    with pytest.raises(ConfigError, match=r"unknown objective 'cross_entropie'.*did you mean 'cross_entropy'"):
        PaddedTinyTrainer.create(tmp_path, quick(objective="cross_entropie"))


def test_trainers_that_build_their_objective_take_no_selection(tmp_path: Path) -> None:
    from theseus.model.finetune import DPOTrainer

    assert "select/objective" not in DPOTrainer.schema()
    with pytest.raises(ConfigError, match="has no objective to select"):
        DPOTrainer.selected({}, {"objective": "cross_entropy"})


def test_a_batch_without_what_the_objective_reads_is_refused(tmp_path: Path) -> None:
    trainer = PaddedTinyTrainer.create(tmp_path, quick())
    state = trainer.init_state()
    batch = trainer.sharding.put_batch(trainer.host_batch("val", position=0))
    with pytest.raises(DataError, match="ReadsAdvantages reads advantages, which the batch lacks"):
        steps.val_step(PaddedTinyTrainer, state, batch, objective=ReadsAdvantages(), sharding=trainer.sharding)


class SummedLogps(Objective):
    """Minus the summed target log-probabilities: an objective that reads them, not the model's loss."""

    needs = Needs("target_logps")

    def __call__(self, scores: Scores, batch: Any) -> tuple[jax.Array, dict[str, Any]]:
        return -jnp.sum(scores.logps), {}


def test_the_model_auxiliary_losses_join_every_objective_in_training() -> None:
    import optax

    from theseus.config import Schema, configuration, configure, resolve
    from theseus.model.models import Mixtral
    from theseus.training.state import TrainState

    with configuration(resolve(Schema.build(Mixtral.gather()))):
        model = configure(Mixtral)  # its small default: 2 layers of 8 experts
    x = jax.random.randint(jax.random.key(0), (2, 16), 0, int(model.architecture.vocab_size))
    params = jax.jit(model.init)(jax.random.key(1), x)["params"]
    state = TrainState.create(apply_fn=model.apply, params=params, tx=optax.sgd(0.1), model=model)
    batch = {"x": x, "y": x, "padding_mask": jnp.ones_like(x, bool)}

    def loss(deterministic: bool) -> tuple[jax.Array, dict[str, Any]]:
        return steps.objective_loss(PaddedTinyTrainer, SummedLogps(), state, params, batch, None, deterministic)

    trained, meta = jax.jit(lambda: loss(False))()
    validated, _ = jax.jit(lambda: loss(True))()
    assert float(meta["aux_loss"]) > 0
    rel = float32_tolerance(model_ops(model))  # two programs of the model's forward pass
    assert float(trained) == pytest.approx(float(validated) + float(meta["aux_loss"]), rel=rel)


class TwoUpdates(CrossEntropy):
    updates = 2


class TwoUpdateTrainer(PaddedTinyTrainer):  # type: ignore[misc, valid-type]
    OBJECTIVE = TwoUpdates


def test_a_declared_objective_sets_the_updates_the_schedule_counts(tmp_path: Path) -> None:
    assert PaddedTinyTrainer.create(tmp_path, quick()).updates_per_step() == 1
    assert TwoUpdateTrainer.create(tmp_path, quick()).updates_per_step() == 2


def test_an_old_policy_without_target_logps_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"declare Needs\('target_logps', old_policy=True\)"):
        Needs("loss", old_policy=True)
