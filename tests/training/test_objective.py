"""Objectives: the one train step runs the objective a trainer declares, passed as ``objective=``; an
override of ``train_step`` / ``val_step`` with the guide's signatures runs it unchanged (the older
``val_step`` signature with one warning); a step called without an objective fails; objectives are
selected by registered name, and the step computes exactly what an objective reads."""

from __future__ import annotations

import math
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
from theseus.training.objective import CrossEntropy, Needs, Objective, Scores


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


class HalfObjectiveTrainer(PaddedTinyTrainer):
    OBJECTIVE = HalfCrossEntropy


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
    # The guide's val_step keeps the older signature (keyword-only sharding, no **kwargs): it runs the
    # declared objective, after one warning naming the change.
    with pytest.warns(DeprecationWarning, match=r"val_step takes no objective=: give it \*\*kwargs"):
        plain_sum, plain_count, _ = plain.val_step_fn()(plain.init_state(), batch)
    half_sum, half_count, meta = half.val_step_fn()(half.init_state(), batch)
    assert int(half_count) == int(plain_count) == int(meta["valid_tokens"])
    # Validation scores the targets' cross-entropy whatever the objective; the objective's own loss rides beside.
    assert float(half_sum) == pytest.approx(float(plain_sum), rel=rel)
    assert float(meta["objective_loss_sum"]) == pytest.approx(0.5 * float(plain_sum), rel=rel)


def test_validation_and_perplexity_mean_cross_entropy_whatever_the_objective(tmp_path: Path) -> None:
    from theseus.evaluation import Perplexity

    plain = PaddedTinyTrainer.create(tmp_path, quick())
    half = HalfObjectiveTrainer.create(tmp_path, quick())
    state = plain.init_state()
    ours, theirs = plain.validate(state, batches=2), half.validate(state, batches=2)
    model = plain.model
    rel = float32_tolerance(3 * transformer_ops(1, model.width, model.block_size, model.vocab_size))
    assert theirs["loss"] == pytest.approx(ours["loss"], rel=rel) and theirs["targets"] == ours["targets"]
    assert theirs["half_cross_entropy_loss"] == pytest.approx(0.5 * ours["loss"], rel=rel)
    assert "half_cross_entropy_loss" not in ours and "objective_loss_sum" not in theirs
    perplexity = Perplexity(batches=2).evaluate(half, state)
    assert perplexity["perplexity"] == pytest.approx(math.exp(ours["loss"]), rel=rel)


def test_a_step_jitted_by_hand_runs_the_objective_it_is_given_and_none_without_one(tmp_path: Path) -> None:
    trainer = PaddedTinyTrainer.create(tmp_path, quick())
    state = trainer.init_state()
    batch = trainer.device_train_batch(trainer.host_batch("train", position=0))
    options = {"sharding": trainer.sharding}

    def loss_of(objective: Objective) -> float:
        step = jax.jit(lambda s, b, k: PaddedTinyTrainer.train_step(s, b, k, 1, objective=objective, **options)[1])
        return float(step(state, batch, trainer.step_key(0)))

    plain, half = loss_of(CrossEntropy()), loss_of(HalfCrossEntropy())
    model = trainer.model  # two programs, each free to order the tiny model's passes its own way
    rel = float32_tolerance(3 * transformer_ops(1, model.width, model.block_size, model.vocab_size))
    assert half == pytest.approx(0.5 * plain, rel=rel)
    with pytest.raises(TypeError, match=r"train_step\(\) needs objective=: the objective to optimise"):
        jax.jit(lambda s, b, k: PaddedTinyTrainer.train_step(s, b, k, 1, **options))(state, batch, trainer.step_key(0))
    val = trainer.sharding.put_batch(trainer.host_batch("val", position=0))
    with pytest.raises(TypeError, match=r"val_step\(\) needs objective="):
        PaddedTinyTrainer.val_step(state, val, **options)


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


class ScaledByBatchSize(Objective):
    """Bound to its trainer: its scale is the trainer's own ``training/batch_size`` key."""

    selectable = False
    built = 0

    def __init__(self, scale: float) -> None:
        self.scale = scale

    @classmethod
    def for_trainer(cls, trainer: Any) -> ScaledByBatchSize:
        cls.built += 1
        return cls(float(trainer.args.batch_size))

    def __call__(self, scores: Scores, batch: Any) -> tuple[jax.Array, dict[str, Any]]:
        return self.scale * scores.loss, {}


class BoundObjectiveTrainer(PaddedTinyTrainer):  # type: ignore[misc, valid-type]
    OBJECTIVE = ScaledByBatchSize


def test_one_declaration_builds_every_objective_once_bound_ones_from_their_trainer(tmp_path: Path) -> None:
    """``OBJECTIVE`` is the one way to choose the loss: an objective bound to its trainer builds itself from
    the trainer's keys (``for_trainer``), once per trainer, and takes no ``objective=``; every trainer of
    the framework declares its objective so, none overrides ``objective()``."""
    from theseus.model.finetune import DPOTrainer
    from theseus.model.reward.trainer import RewardTrainer
    from theseus.model.rl.distill import OfflineDistillTrainer, OnPolicyDistillTrainer
    from theseus.model.rl.trainer import GRPOTrainer
    from theseus.training.base import BaseTrainer

    trainer = BoundObjectiveTrainer.create(tmp_path, quick(training__batch_size=4))
    assert trainer.objective() is trainer.objective() and ScaledByBatchSize.built == 1
    assert trainer.objective().scale == 4.0
    assert "select/objective" not in BoundObjectiveTrainer.schema()
    with pytest.raises(ConfigError, match="has no objective to select"):
        BoundObjectiveTrainer.selected({}, {"objective": "cross_entropy"})
    for job in (DPOTrainer, RewardTrainer, GRPOTrainer, OfflineDistillTrainer, OnPolicyDistillTrainer):
        assert job.objective is BaseTrainer.objective, job
        assert not job.declared_objective().selectable and "select/objective" not in job.schema()


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


def test_a_run_records_its_objective_with_its_plain_values() -> None:
    from dataclasses import dataclass

    from theseus.runs.directory import objective_record

    @dataclass(frozen=True)
    class Smoothed(Objective):
        smoothing: float = 0.1
        teacher: Any = object()  # not a plain value: left out

    record = objective_record(Smoothed())
    assert record["class"].endswith(":test_a_run_records_its_objective_with_its_plain_values.<locals>.Smoothed")
    assert record["values"] == {"smoothing": 0.1}
    assert Smoothed().metric == "smoothed_loss" and HalfCrossEntropy().metric == "half_cross_entropy_loss"

    class DPOLoss(Objective):
        pass

    class ZLossCrossEntropy(Objective):
        pass

    assert DPOLoss().metric == "dpo_loss" and ZLossCrossEntropy().metric == "z_loss_cross_entropy_loss"


def test_an_objectives_array_fields_travel_apart_from_its_settings() -> None:
    """``array_field`` marks what the jitted step takes as an argument: left out of equality (so the
    objective's settings alone say which program it is) and put back by ``with_arrays``."""
    import dataclasses

    import numpy as np

    from theseus.training.objective import CrossEntropy, Objective, array_field, with_teacher

    @dataclasses.dataclass(frozen=True)
    class Scaled(Objective):
        scale: float = 1.0
        table: object = array_field()

    plain = Scaled(2.0)
    held = plain.with_arrays({"table": np.ones(3)})
    assert plain.arrays() == {"table": None} and list(held.arrays()) == ["table"]
    assert held == plain and hash(held) == hash(plain) and held.scale == 2.0
    assert CrossEntropy().arrays() == {} and CrossEntropy().with_arrays({}) is not None
    with pytest.warns(DeprecationWarning, match="with_teacher"):
        assert "teacher/w" in with_teacher({"x": 1}, {"w": np.zeros(2)})
