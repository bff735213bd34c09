"""Distillation: a student learns the token distributions of a teacher (``distill/teacher``).

* ``train/distill``, on-policy (GKD, Agarwal et al. 2024): a ``RolloutTrainer``, as ``GRPOTrainer`` is,
  with a divergence for its loss. Each update the student samples ``rl/group_size`` completions of each
  of ``training/batch_size / rl/group_size`` prompts of an environment (its ``RolloutSource``, as GRPO's:
  the KV-cache decoder on the run's mesh, ``rl/max_new_tokens``, ``rl/temperature``, ``rl/top_p``; the
  rewards are scored and logged, never trained on), and the loss is the generalized Jensen-Shannon
  divergence (``distill/beta``) between the student's and the teacher's distributions at the
  completions' positions (``theseus.model.rl.loss.generalized_jsd``); GRPO's policy-loss keys are not
  this job's.
* ``train/distill_offline``: batches of a dataset (SFT's chat data by default; ``dataset=`` selects
  another) and the forward ``KL(teacher || student)`` at every position that counts
  (``theseus.model.rl.loss.forward_kl``).

Both divide the logits by ``distill/temperature``. The teacher is a theseus run (its own model and
latest checkpoint) or a local Hugging Face folder (``theseus.model.rl.teacher``) with the student's
vocabulary. Its parameters are read once, placed on the student's mesh and given to the jitted step
with every call as the objective's ``teacher_params`` (an argument of the compiled program, not a
constant of it); its logits are computed there, and no gradient reaches it. LoRA
(``model/lora/rank``), ``training/init_from`` and the sharding layouts work as in ``SFTTrainer``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from theseus.config import field
from theseus.model.finetune.trainer import SFTConfig, SFTTrainer
from theseus.model.rl.loss import forward_kl, generalized_jsd
from theseus.model.rl.rollout_source import RolloutConfig
from theseus.model.rl.rollout_trainer import RolloutTrainer
from theseus.model.rl.rollouts import reward_means, rollout_metrics
from theseus.model.rl.teacher import TEACHER_KEY, Teacher, check_student, open_teacher
from theseus.training.base import Batch
from theseus.training.objective import Needs, Objective, Scores, array_field
from theseus.training.state import TrainState
from theseus.training.steps import OBJECTIVE_LOSS_SUM, OBJECTIVE_WEIGHT


@dataclass
class DistillConfig(SFTConfig):
    """The teacher and the temperature of the distributions compared."""

    teacher: str = field(
        TEACHER_KEY, default="", path="spec", help="the model imitated: run:<name>[@step] or hf:<folder>"
    )
    distill_temperature: float = field(
        "distill/temperature", default=1.0, above=0.0, help="divides student and teacher logits in the loss"
    )


@dataclass
class OnPolicyDistillConfig(DistillConfig):
    """On-policy distillation: the teacher, the temperature and the generalized JSD's mixture weight (the
    rollouts' keys: ``DistillRolloutConfig``)."""

    distill_beta: float = field(
        "distill/beta",
        default=0.5,
        min=0.0,
        max=1.0,
        help="generalized JSD's mixture weight: 0 = KL(teacher||student), 1 = KL(student||teacher)",
    )


@dataclass
class DistillRolloutConfig(RolloutConfig):
    """The rollouts of on-policy distillation: one completion per prompt by default (no group is compared)."""

    group_size: int = field("rl/group_size", default=1, min=1, help="completions per prompt")


# -- the loss -------------------------------------------------------------------------------------
def loss_mask(batch: Batch) -> jax.Array:
    """Where the divergence is taken: a rollout's completion tokens (``completion_mask``), else every
    target of the batch (``y != -1``, not padding)."""
    if "completion_mask" in batch:
        return jnp.asarray(batch["completion_mask"]).astype(bool)
    valid = batch["y"] != -1
    padding = batch.get("padding_mask")
    return valid if padding is None else valid & jnp.asarray(padding).astype(bool)


def divergence(objective: Divergence, student: jax.Array, teacher: jax.Array, mask: jax.Array) -> jax.Array:
    """The objective's divergence, a mean over the positions of ``mask``, in float32."""
    student, teacher = student.astype(jnp.float32), teacher.astype(jnp.float32)
    if objective.loss == "forward_kl":
        return forward_kl(student, teacher, mask, temperature=objective.temperature)
    return generalized_jsd(student, teacher, mask, beta=objective.beta, temperature=objective.temperature)


@dataclass(frozen=True)
class Divergence(Objective):
    """The divergence of the student's distributions from the teacher's (``teacher``: its model,
    ``teacher_params``: its parameters, which the trainer gives the step with each call) at the positions of
    :func:`loss_mask`, which a micro-batch weighs."""

    teacher: Any = None
    loss: str = "jsd"  # jsd (on-policy) | forward_kl (offline)
    beta: float = 0.5
    temperature: float = 1.0
    teacher_params: Any = array_field()

    selectable: ClassVar[bool] = False

    @classmethod
    def for_trainer(cls, trainer: Any) -> Divergence:
        """The divergence of the trainer's ``distill/*`` keys: on rollouts, the generalized JSD at
        ``distill/beta``; offline, the forward KL; both at ``distill/temperature``."""
        a = trainer.args
        if isinstance(a, OnPolicyDistillConfig):
            return cls(trainer.teacher.model, "jsd", float(a.distill_beta), float(a.distill_temperature))
        return cls(trainer.teacher.model, "forward_kl", 0.0, float(a.distill_temperature))

    @property
    def needs(self) -> Needs:
        """The student's full logits and the teacher's."""
        return Needs("logits", teacher=self.teacher)

    def __call__(self, scores: Scores, batch: Batch) -> tuple[jax.Array, dict[str, Any]]:
        """The divergence and, for rollouts, their metrics."""
        return divergence(self, scores.logits, scores.teacher_logits, loss_mask(batch)), rollout_metrics(batch)

    def weight_of(self, batch: Batch) -> jax.Array:
        return jnp.sum(loss_mask(batch), dtype=jnp.float32)


# -- the trainers ---------------------------------------------------------------------------------
class Distillation(SFTTrainer):
    """What both distillation trainers share: the teacher (opened and checked at set-up, its parameters
    read once and given to the step with every call) and the divergence they optimise."""

    CONFIG: ClassVar[type] = DistillConfig
    OBJECTIVE: ClassVar[Any] = Divergence  # built from distill/* and the teacher (Divergence.for_trainer)

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        self._teacher: Teacher | None = None
        self._teacher_params: Any = None

    def setup(self) -> None:
        if self._ready:
            return
        super().setup()
        spec = self.flywheel.tokenizer_spec if self.flywheel is not None else self.tokenizer().spec
        check_student(self.teacher, int(self.model.architecture.vocab_size), spec, self.sequence_length)

    @property
    def teacher(self) -> Teacher:
        """The teacher ``distill/teacher`` names (its parameters are not read here)."""
        if self._teacher is None:
            self._teacher = open_teacher(self.args.teacher, self.context.root, self.run_name)
        return self._teacher

    def teacher_params(self) -> Any:
        """The teacher's parameters on the student's mesh, read at the first call."""
        if self._teacher_params is None:
            self._teacher_params = self.teacher.load(self.sharding)
        return self._teacher_params

    def objective_arrays(self) -> dict[str, Any]:
        """The teacher's parameters, the divergence's ``teacher_params``."""
        return {"teacher_params": self.teacher_params()}

    def abstract_objective_arrays(self) -> dict[str, Any]:
        return {"teacher_params": self.teacher.abstract(self.sharding)}

    def close(self) -> None:
        """Release the data loader and the teacher's parameters (read again when next needed)."""
        super().close()
        self._teacher_params = None


class OfflineDistillTrainer(Distillation):
    """Offline logit distillation of ``MODEL`` on ``DATASET``: the forward KL to the teacher's
    distributions at every target. Subclass it to change the model or the data, as with ``SFTTrainer``."""


class OnPolicyDistillTrainer(Distillation, RolloutTrainer):
    """On-policy distillation (GKD) of ``MODEL`` on the prompts of ``ENVIRONMENT`` (``environment=``
    selects another): the student's rollouts (a ``RolloutSource``, as GRPO's), the teacher's distributions
    on them."""

    CONFIG: ClassVar[type] = OnPolicyDistillConfig
    ROLLOUTS: ClassVar[type[RolloutConfig]] = DistillRolloutConfig

    def validate(self, state: TrainState, batches: int | None = None, slice: str = "val") -> dict[str, Any]:
        """Completions of ``batches`` x (global micro batch) prompts of the environment's ``eval`` split,
        greedy or at ``rl/eval_temperature``: ``loss``, the divergence from the teacher on them,
        ``targets`` (the positions it is taken at) and the rewards (``reward_means``)."""
        a: OnPolicyDistillConfig = self.args
        batches = a.eval_batches if batches is None else batches
        count = self.eval_rows
        if batches * count == 0:
            return {"loss": float("nan"), "targets": 0}
        done = self.eval_rollouts(state, batches, count)
        rows = self.rollout_source.arrange(done)
        loss, positions = self._divergence(state, rows, count)
        result: dict[str, Any] = {"loss": loss, **reward_means(done, self.rollout_source.environment)}
        result["completion_length"] = float(np.mean(rows["completion_length"]))
        result["targets"] = int(positions)
        return result

    def _divergence(self, state: TrainState, rows: Mapping[str, np.ndarray], count: int) -> tuple[float, float]:
        """The divergence from the teacher over the completions of ``rows`` (``count`` rows per pass) and
        the number of positions it is taken at (the objective's loss and weight of validation's metadata)."""
        fn = self.val_step_fn()
        sums = []
        for start in range(0, len(rows["x"]), count):
            chunk = {name: value[start : start + count] for name, value in rows.items()}
            meta = fn(state, self.sharding.put_global(chunk))[2]
            sums.append((meta[OBJECTIVE_LOSS_SUM], meta[OBJECTIVE_WEIGHT]))
        fetched = jax.device_get(sums)
        positions = sum(float(n) for _, n in fetched)
        return sum(float(total) for total, _ in fetched) / max(positions, 1.0), positions


__all__ = [
    "DistillConfig",
    "DistillRolloutConfig",
    "Distillation",
    "Divergence",
    "OfflineDistillTrainer",
    "OnPolicyDistillConfig",
    "OnPolicyDistillTrainer",
    "divergence",
    "loss_mask",
]
