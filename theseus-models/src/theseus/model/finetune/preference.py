"""Preference objectives (DPO, IPO, SimPO): pure functions of per-sequence log-probabilities.

A batch of preference data holds pairs in consecutive rows: row ``2j`` is the chosen response of
pair ``j`` and row ``2j + 1`` the rejected one (the ``"pairs"`` style). Log-probabilities are summed
over each response's learned tokens (``y != -1``) by ``theseus.base.logprobs.sequence_logps``; the
objectives and metrics follow TRL's definitions and names:

* ``sigmoid`` (DPO): ``-log sigmoid(β Δ)`` with ``Δ = (log π_c - log ref_c) - (log π_r - log ref_r)``;
  ``label_smoothing`` ε gives the conservative form ``-(1-ε) log sigmoid(β Δ) - ε log sigmoid(-β Δ)``;
* ``ipo``: ``(Δ' - 1/(2β))²`` with ``Δ'`` the log-ratios averaged per response token;
* ``simpo``: no reference; ``Δ = mean log π_c - mean log π_r - gamma/β`` in the smoothed sigmoid form.

:class:`Preference` is the objective ``train/dpo`` optimises (:mod:`theseus.training.objective`): it
reads the targets' log-probabilities (chunked by ``model/loss_chunk``), the reference's from the batch
or the frozen base, and weighs a micro-batch by its pairs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from theseus.base.logprobs import scored_positions
from theseus.errors import ConfigError
from theseus.training.objective import Batch, Metrics, Needs, Objective, Scores

LOSSES = ("sigmoid", "ipo", "simpo")
#: Where the reference log-probabilities come from: the batch (``reference_logps``, computed apart
#: or precomputed), the policy itself with its LoRA adapters switched off, or nowhere (SimPO).
REFERENCES = ("batch", "adapters", "none")


@dataclass(frozen=True)
class Preference(Objective):
    """A preference loss on pairs of rows (chosen, rejected) and where its reference comes from."""

    loss: str = "sigmoid"
    beta: float = 0.1
    label_smoothing: float = 0.0
    simpo_gamma: float = 0.5
    reference: str = "batch"

    selectable: ClassVar[bool] = False

    @classmethod
    def for_trainer(cls, trainer: Any) -> Preference:
        """The preference loss of the trainer's ``dpo/*`` keys; its reference is the frozen base with LoRA
        (unless precomputed), none for SimPO, else log-probabilities the batch carries."""
        args = trainer.args
        if args.loss == "simpo":
            reference = "none"
        elif trainer.lora_rank > 0 and not args.precompute_reference:
            reference = "adapters"
        else:
            reference = "batch"
        return cls(args.loss, float(args.beta), float(args.label_smoothing), float(args.simpo_gamma), reference)

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ConfigError(f"dpo/loss={self.loss!r} is not one of {', '.join(LOSSES)}")
        if not self.beta > 0:
            raise ConfigError(f"dpo/beta must be above 0, got {self.beta!r}")
        if not 0 <= self.label_smoothing < 0.5:
            raise ConfigError(f"dpo/label_smoothing must lie in [0, 0.5), got {self.label_smoothing!r}")
        if self.reference not in REFERENCES:
            raise ConfigError(f"reference {self.reference!r} is not one of {', '.join(REFERENCES)}")

    @property
    def uses_reference(self) -> bool:
        """Whether the loss compares with a reference model (all but SimPO)."""
        return self.loss != "simpo"

    @property
    def needs(self) -> Needs:
        """The targets' log-probabilities; the reference's from the batch or the frozen base."""
        from_batch = ("reference_logps",) if self.reference == "batch" else ()
        return Needs("target_logps", batch=from_batch, frozen_base=self.reference == "adapters")

    def __call__(self, scores: Scores, batch: Batch) -> tuple[jax.Array, Metrics]:
        """The mean loss over the pairs of ``batch`` and TRL's metrics."""
        logps = jnp.sum(scores.logps, axis=-1)
        counts = jnp.sum(scored_positions(batch["y"], batch.get("padding_mask")), axis=-1).astype(jnp.float32)
        reference = None
        if self.reference == "adapters":
            reference = jnp.sum(scores.base_logps, axis=-1)
        elif self.reference == "batch":
            reference = batch["reference_logps"]
        return preference_loss(self, logps, counts, reference)

    weight_name = "pairs"

    def weight_of(self, batch: Batch) -> jax.Array:
        """A micro-batch weighs its number of pairs (the loss is a mean over pairs)."""
        return jnp.asarray(batch["x"].shape[0] // 2, jnp.float32)


def pairs_of(rows: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The chosen (even rows) and rejected (odd rows) halves of a per-row array."""
    return rows[0::2], rows[1::2]


def _smoothed_sigmoid(margin: jax.Array, beta: float, smoothing: float) -> jax.Array:
    loss = -jax.nn.log_sigmoid(beta * margin)
    if smoothing:
        loss = (1 - smoothing) * loss - smoothing * jax.nn.log_sigmoid(-beta * margin)
    return loss


def preference_loss(
    objective: Preference, logps: jax.Array, counts: jax.Array, reference: jax.Array | None
) -> tuple[jax.Array, dict[str, Any]]:
    """The mean loss over the pairs and TRL's metrics (``rewards/*``, ``logps/*``).

    ``logps`` and ``counts`` are per row (``theseus.base.logprobs.sequence_logps``); ``reference`` holds the
    reference model's summed log-probabilities per row (None for SimPO).
    """
    chosen, rejected = pairs_of(logps)
    n_chosen, n_rejected = (jnp.maximum(c, 1.0) for c in pairs_of(counts))
    beta = objective.beta
    if objective.uses_reference:
        if reference is None:
            raise ConfigError(f"dpo/loss={objective.loss} needs the reference log-probabilities")
        ref_chosen, ref_rejected = pairs_of(jax.lax.stop_gradient(reference))
        chosen_ratio, rejected_ratio = chosen - ref_chosen, rejected - ref_rejected
        if objective.loss == "ipo":
            margin = chosen_ratio / n_chosen - rejected_ratio / n_rejected
            losses = (margin - 1 / (2 * beta)) ** 2
        else:
            losses = _smoothed_sigmoid(chosen_ratio - rejected_ratio, beta, objective.label_smoothing)
        chosen_reward, rejected_reward = beta * chosen_ratio, beta * rejected_ratio
        logged_chosen, logged_rejected = chosen, rejected
    else:
        logged_chosen, logged_rejected = chosen / n_chosen, rejected / n_rejected
        margin = logged_chosen - logged_rejected - objective.simpo_gamma / beta
        losses = _smoothed_sigmoid(margin, beta, objective.label_smoothing)
        chosen_reward, rejected_reward = beta * logged_chosen, beta * logged_rejected
    chosen_reward, rejected_reward = jax.lax.stop_gradient((chosen_reward, rejected_reward))
    metrics = {
        "rewards/chosen": jnp.mean(chosen_reward),
        "rewards/rejected": jnp.mean(rejected_reward),
        "rewards/accuracies": jnp.mean((chosen_reward > rejected_reward).astype(jnp.float32)),
        "rewards/margins": jnp.mean(chosen_reward - rejected_reward),
        "logps/chosen": jnp.mean(jax.lax.stop_gradient(logged_chosen)),
        "logps/rejected": jnp.mean(jax.lax.stop_gradient(logged_rejected)),
    }
    return jnp.mean(losses), metrics


__all__ = ["LOSSES", "REFERENCES", "Preference", "pairs_of", "preference_loss"]
