"""A training objective: cross-entropy with a z-loss (PaLM, Chowdhery et al. 2022, section 5).

``ZLossCrossEntropy`` adds ``weight * log(Z)^2`` to each target's cross-entropy, where ``Z`` is the
softmax normaliser of its position: it keeps the logits from drifting (``log Z`` near 0) without
changing which token is likely. Registered in ``pyproject.toml`` as ``objective/example-z-loss``; a
run selects it by name (``objective=example-z-loss``) on any trainer whose ``OBJECTIVE`` is selectable,
and its one key sits under ``objective/example-z-loss/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from theseus.base.logprobs import scored_positions, token_logps
from theseus.config import field
from theseus.training.objective import Batch, Needs, Objective, Scores


@dataclass(frozen=True)
class ZLossCrossEntropy(Objective):
    """Mean cross-entropy plus ``weight`` times the mean ``log(Z)^2`` over the targets that count; logs
    both terms as ``cross_entropy`` and ``z_loss``."""

    weight: float = field(
        "objective/example-z-loss/weight", default=1e-4, min=0.0, help="weight of the mean log(Z)^2 (PaLM: 1e-4)"
    )

    #: It reads the full logits (the model's own loss has no log Z in it).
    needs = Needs("logits")

    def __call__(self, scores: Scores, batch: Batch) -> tuple[jax.Array, dict[str, Any]]:
        logits = jnp.asarray(scores.logits, jnp.float32)
        y, mask = batch["y"], batch.get("padding_mask")
        scored = scored_positions(y, mask)
        count = jnp.maximum(jnp.sum(scored), 1).astype(jnp.float32)
        cross_entropy = -jnp.sum(token_logps(logits, y, mask)) / count
        log_z = jax.nn.logsumexp(logits, axis=-1)
        z_loss = jnp.sum(jnp.where(scored, log_z**2, 0.0)) / count
        return cross_entropy + self.weight * z_loss, {"cross_entropy": cross_entropy, "z_loss": z_loss}
