"""``GRPOTrainer``: online reinforcement learning with group-relative advantages (the GRPO family).

Each step its ``RolloutSource`` (``theseus.model.rl.rollout_source``) samples ``B`` prompts from the
environment (``ENVIRONMENT``; ``environment=countdown`` selects another registered one, its keys under
``environment/<name>/``), generates ``rl/group_size`` completions for each with the policy's current
parameters (the KV-cache decoder on the trainer's mesh) and scores them with the environment's weighted
rewards (``rl/rewards``); the trainer turns the scores into advantages within each prompt's group
and takes ``rl/updates_per_rollout`` updates of the policy loss (``theseus.model.rl.loss.policy_loss``:
``rl/loss`` grpo | dr_grpo | dapo | bnpo | cispo | sapo | luspo | vespo, ``rl/importance_sampling``
token | sequence) against the sampling policy's log-probabilities.
``training/batch_size`` counts completions: ``B = training/batch_size / rl/group_size``. With
``rl/dynamic_sampling``, groups whose rewards are all equal are replaced by further rounds (DAPO).

Rollouts are a pure function of the parameters and ``(training/seed, step, round)``, so a killed or
preempted run resumes bit-exactly. LoRA (``model/lora/rank``), ``training/init_from`` and every
sharding layout work as in ``SFTTrainer``. Prompts are read with the tokenizer of the source the policy
starts from (a Hugging Face checkpoint's, ``training/init_from=hf:DIR``, or a run's; else the byte
tokenizer) and, with ``rl/chat``, rendered by its chat template; completions end at its end-of-text and
end-of-turn tokens (``theseus.model.rl.prompts``). An environment with stop strings plays episodes of
several turns, its replies masked from the loss (``theseus.model.rl.episodes``). With ``rl/beta > 0`` a
KL penalty to the reference is added: the policy with its LoRA adapters off, or, in full fine-tuning, a
frozen copy of the initial parameters (``theseus.model.rl.reference``). With ``rl/pack`` the policy, reference and
old-policy passes score the rows packed with segment ids and gather their log-probabilities back to one row per
completion (``theseus.training.packing``), logging ``pack_fill`` and ``pack_rows``.

Every step logs the reward (mean, std, and each reward's mean), accuracy, the completion length (mean
and max), entropy, the clipped fractions, the mean ratio and KL, the share of groups with equal
rewards, and the rollout's time, tokens per second and share of the step. Validation generates
greedily on the environment's ``eval`` split; its loss is the negative mean reward (so the best
checkpoint is the one that scores highest).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from theseus.config import field
from theseus.model.finetune.trainer import SFTConfig
from theseus.model.rl.episodes import stop_strings
from theseus.model.rl.loss import IMPORTANCE_SAMPLING, group_advantages, policy_loss
from theseus.model.rl.options import PolicyLossOptions
from theseus.model.rl.policy_losses import loss_default
from theseus.model.rl.reference import REF_LOGPS, Reference, TargetLogps
from theseus.model.rl.rollout_source import Sampled
from theseus.model.rl.rollout_trainer import RolloutTrainer
from theseus.model.rl.rollouts import PACK_FILL, PACK_ROWS, completion_entropy, reward_means, rollout_metrics
from theseus.training import packing
from theseus.training.base import Batch
from theseus.training.objective import Needs, Objective, Scores
from theseus.training.state import TrainState

#: The batch entry of rollouts made ahead (``rl/async_rollouts``): their sampler's log-probabilities, ``[rows, T]``.
SAMPLING_LOGPS = "sampling_logps"


@dataclass
class GRPOConfig(SFTConfig, PolicyLossOptions):
    """The policy loss and dynamic sampling (the rollouts' keys: ``RolloutConfig``)."""

    loss: str = field(
        "rl/loss",
        default="grpo",
        help="the policy loss: a clipped surrogate averaged as grpo, dr_grpo, dapo, bnpo or luspo; cispo, sapo, "
        "vespo; or one a plugin registered (component rl_loss/<name>)",
    )
    importance_sampling: str | None = field(
        "rl/importance_sampling",
        default=None,
        choices=IMPORTANCE_SAMPLING,
        help="token (GRPO) or sequence (GSPO) ratios (null: the loss's default, token; luspo: sequence)",
    )
    epsilon_low: float = field("rl/epsilon_low", default=0.2, min=0.0, below=1.0, help="lower clip of the ratio")
    epsilon_high: float | None = field(
        "rl/epsilon_high",
        default=None,
        min=0.0,
        help="upper clip (DAPO's clip-higher: 0.28); cispo: the ratio's cap (null: the loss's default, "
        "rl/epsilon_low's value; cispo: 5)",
    )
    beta: float = field(
        "rl/beta",
        default=0.0,
        min=0.0,
        help="KL penalty to the reference (LoRA: the adapters off; full fine-tuning: the initial parameters)",
    )
    scale_rewards: bool = field(
        "rl/scale_rewards", default=True, help="divide advantages by the group's reward std (false: Dr. GRPO)"
    )
    updates: int = field(
        "rl/updates_per_rollout",
        default=1,
        min=1,
        help="optimizer updates on each batch of rollouts (mu), against the sampling policy's log-probabilities",
    )
    dynamic_sampling: bool = field(
        "rl/dynamic_sampling", default=False, help="drop groups whose rewards are all equal and refill them (DAPO)"
    )
    resample_rounds: int = field(
        "rl/resample_rounds", default=3, min=1, help="rounds of refills at most per step (rl/dynamic_sampling)"
    )
    pack: bool = field(
        "rl/pack",
        default=False,
        help="score each step's prompt + completion sequences packed into as few rows as hold them (segment ids) "
        "in the policy, reference and old-policy passes; the losses are unchanged",
    )

    @property
    def upper_clip(self) -> float:
        """``rl/epsilon_high`` as set, else ``rl/loss``'s own default (cispo: 5), else ``rl/epsilon_low``'s
        value (TRL's)."""
        if self.epsilon_high is not None:
            return self.epsilon_high
        return float(loss_default(self.loss, "rl/epsilon_high", self.epsilon_low))

    @property
    def ratio_level(self) -> str:
        """``rl/importance_sampling`` as set, else ``rl/loss``'s own default (luspo: sequence), else token."""
        return self.importance_sampling or str(loss_default(self.loss, "rl/importance_sampling", "token"))


@dataclass(frozen=True)
class Policy(Objective):
    """The GRPO family's clipped-surrogate loss on scored rollouts (``rl/*``): ``updates`` updates on each
    batch, the later ones against the sampling policy's log-probabilities, with a KL penalty to the frozen
    base (the policy with its adapters off) when ``beta`` > 0, or with ``copied_reference`` to the frozen copy
    of the initial parameters whose log-probabilities the batch carries (``ref_logps``); a micro-batch
    weighs its completions."""

    loss: str = "grpo"
    level: str = "token"
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    beta: float = 0.0
    max_completion_length: int = 32  # dr_grpo's normaliser: the most policy tokens an episode holds
    updates: int = 1
    copied_reference: bool = False
    options: tuple[tuple[str, Any], ...] = ()  # further policy_loss keywords (PolicyLossOptions)

    selectable: ClassVar[bool] = False

    @classmethod
    def for_trainer(cls, trainer: Any) -> Policy:
        """The policy loss of the trainer's ``rl/*`` keys; its normaliser is the longest completion its
        rollouts hold, and full fine-tuning with a KL compares with a frozen copy of the initial parameters."""
        a: GRPOConfig = trainer.args
        source = trainer.rollout_source
        return cls(
            a.loss,
            a.ratio_level,
            a.epsilon_low,
            a.upper_clip,
            a.beta,
            source.limits.longest_completion(multi_turn=bool(stop_strings(source.environment))),
            a.updates,
            copied_reference=a.beta > 0 and trainer.lora_rank <= 0,
            options=a.policy_loss_options(a.loss),
        )

    @property
    def needs(self) -> Needs:
        """The completions' log-probabilities and entropies, the old policy's, the reference's with a KL."""
        copied = self.beta > 0 and self.copied_reference
        rollout = ("completion_mask", "advantages", "reward", *((REF_LOGPS,) if copied else ()))
        frozen_base = self.beta > 0 and not copied
        return Needs("target_logps", entropy=True, batch=rollout, frozen_base=frozen_base, old_policy=True)

    def __call__(self, scores: Scores, batch: Batch) -> tuple[jax.Array, dict[str, Any]]:
        """The policy loss (``theseus.model.rl.loss.policy_loss``) and the rollout's metrics."""
        mask = batch["completion_mask"].astype(jnp.float32)
        loss, metrics = policy_loss(
            scores.logps,
            scores.old_logps,
            batch["advantages"],
            mask,
            loss_type=self.loss,
            importance_sampling=self.level,  # type: ignore[arg-type]
            epsilon_low=self.epsilon_low,
            epsilon_high=self.epsilon_high,
            beta=self.beta,
            ref_logps=batch[REF_LOGPS] if self.beta > 0 and self.copied_reference else scores.base_logps,
            max_completion_length=self.max_completion_length,
            num_items_in_batch=jnp.sum(mask),
            sampling_logps=batch.get(SAMPLING_LOGPS),  # rollouts made ahead, by older parameters
            **dict(self.options),
        )
        logged = rollout_metrics(batch)
        logged["reward_std"] = jnp.std(batch["reward"])
        logged["entropy"] = completion_entropy(jax.lax.stop_gradient(scores.entropy), mask)
        return loss, {**metrics, **logged}

    def weight_of(self, batch: Batch) -> jax.Array:
        return jnp.asarray(batch["x"].shape[0], jnp.float32)


class GRPOTrainer(RolloutTrainer):
    """GRPO-family training of ``MODEL`` (``model=`` selects another) on ``ENVIRONMENT`` (``environment=``
    selects another)."""

    CONFIG: ClassVar[type] = GRPOConfig
    OBJECTIVE: ClassVar[Any] = Policy  # built from rl/* and the rollouts (Policy.for_trainer)

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        self._reference: Reference | None = None  # full fine-tuning with rl/beta > 0: the initial parameters
        self._sampler_logps: TargetLogps | None = None  # rollouts made ahead: their sampler's log-probabilities

    def updates_per_step(self) -> int:
        """``rl/updates`` (the policy's ``updates``), read from the key: building the policy needs the
        rollouts, which are set up after this is first asked."""
        return int(self.args.updates)

    def resample_rounds(self) -> int:
        """``rl/resample_rounds`` with ``rl/dynamic_sampling``, else 0."""
        a: GRPOConfig = self.args
        return a.resample_rounds if a.dynamic_sampling else 0

    def setup(self) -> None:
        if self._ready:
            return
        super().setup()
        a: GRPOConfig = self.args
        a.check_policy_loss(a.loss, a.upper_clip)
        if a.beta > 0 and self.lora_rank <= 0:
            self._reference = Reference(self)  # full fine-tuning: a frozen copy of the initial parameters

    # -- rollouts -------------------------------------------------------------------------------
    def rollout_rows(self, sampled: Sampled, step: int) -> dict[str, np.ndarray]:
        """The rows of the rollouts with each completion's advantage within its group and, in full
        fine-tuning with a KL penalty, the reference's log-probabilities (once per rollout)."""
        a: GRPOConfig = self.args
        done, size = sampled.rollouts, self.rollout_source.settings.group_size
        if not any(group.varied() for group in done.groups(size)):
            self._warn_flat(step)
        advantages = group_advantages(jnp.asarray(done.rewards, jnp.float32), size, scale=a.scale_rewards)
        batch = self.rollout_source.rows(done)
        if a.pack:
            batch.update(self._packed(batch))
        if self._reference is not None:
            batch[REF_LOGPS] = self._reference.logps(batch)
        batch["advantages"] = np.asarray(advantages, np.float32)
        return batch

    def _packed(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``rl/pack``: the rows packed (:func:`theseus.training.packing.pack`), each process's share apart and
        in a multiple of the devices its rows are split over (the rollout devices' too, which score rollouts
        made ahead), with ``pack_fill`` (real tokens ÷ packed positions) and ``pack_rows`` (the packed rows)."""
        shares = self.sharding.feed_count
        multiple = self.sharding.data_size // shares
        if self._rollout_sharding is not None:
            multiple = math.lcm(multiple, self._rollout_sharding.data_size)
        packed = packing.pack(batch, shares=shares, multiple=multiple)
        rows = len(batch["x"])
        columns = {PACK_FILL: packed.fill, PACK_ROWS: packed.rows}
        return {**packed.entries, **{name: np.full(rows, v, np.float32) for name, v in columns.items()}}

    def sampler_rows(self, params: Any, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """With the sampling correction (``rl/sampling_correction``), the log-probabilities of rollouts made
        ahead (``rl/async_rollouts``) under the parameters that sampled them (``sampling_logps``), against
        which the update weighs each token (``theseus.model.rl.importance``)."""
        if not self.args.sampling_correction:
            return {}
        if self._sampler_logps is None:  # where the sampler's parameters live: the rollouts' mesh
            self._sampler_logps = TargetLogps(self, self.rollout_source.sharding)
        return {SAMPLING_LOGPS: self._sampler_logps(params, batch)}

    def _warn_flat(self, step: int) -> None:
        """Once: every group of the rollout at data position ``step`` (update ``step + 1``) scored the same
        within itself, so the update has no gradient."""
        a: GRPOConfig = self.args
        fix = (
            f"rl/dynamic_sampling found no group that scores apart in rl/resample_rounds={a.resample_rounds} "
            "rounds; raise it"
            if a.dynamic_sampling
            else "set rl/dynamic_sampling=true to drop such groups and refill them"
        )
        self.rollout_source.warn(
            "flat",
            f"warning: at step {step + 1} every group's completions scored the same, so their advantages and the "
            f"policy gradient are 0; {fix}, or give the reward partial credit or the environment easier prompts "
            "(shown once)",
        )

    def abstract_train_batch(self) -> dict[str, jax.ShapeDtypeStruct]:
        batch = super().abstract_train_batch()
        rows = (self.accumulate_steps, self.micro_rows)
        batch["advantages"] = jax.ShapeDtypeStruct(rows, jnp.float32, sharding=batch["reward"].sharding)
        shape = (*rows, self.sequence_length)
        for name in self._logps_rows():
            batch[name] = jax.ShapeDtypeStruct(shape, jnp.float32, sharding=batch["x"].sharding)
        if self.args.pack:  # at most as many packed rows as rows
            for name in (*packing.PACKED_ROWS, packing.PACKED_INDEX):
                batch[name] = jax.ShapeDtypeStruct(shape, jnp.int32, sharding=batch["x"].sharding)
            for name in (PACK_FILL, PACK_ROWS):
                batch[name] = jax.ShapeDtypeStruct(rows, jnp.float32, sharding=batch["reward"].sharding)
        return batch

    def _logps_rows(self) -> list[str]:
        """The rows of log-probabilities a batch carries: the copied reference's, the sampler's."""
        a: GRPOConfig = self.args
        settings = self.rollout_source.settings
        apart = settings.async_rollouts and settings.max_staleness > 0 and a.sampling_correction
        return [name for name, kept in ((REF_LOGPS, self._reference is not None), (SAMPLING_LOGPS, apart)) if kept]

    # -- validation -----------------------------------------------------------------------------
    def validate(self, state: TrainState, batches: int | None = None, slice: str = "val") -> dict[str, Any]:
        """Completions of ``batches`` x B prompts of the environment's ``eval`` split, greedy or at
        ``rl/eval_temperature``: the mean reward, each reward's mean, accuracy, ``completions`` (how many)
        and ``loss`` = -mean reward."""
        batches = self.args.eval_batches if batches is None else batches
        source = self.rollout_source
        done = self.eval_rollouts(state, batches, source.prompts_per_step)
        result = {"loss": -float(np.mean(done.rewards)), **reward_means(done, source.environment)}
        result["completions"] = len(done.rewards)
        return result


__all__ = ["SAMPLING_LOGPS", "GRPOConfig", "GRPOTrainer", "Policy"]
