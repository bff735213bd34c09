"""What a step's rollouts are and what is logged of them: ``Rollouts`` (scored completions in groups),
the per-row batch entries logged as means, and validation's reward means."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from theseus.rl.environment import Environment
from theseus.training.base import Batch


@dataclass
class Rollouts:
    """Scored completions, each prompt's ``rl/group_size`` consecutive: token ids of prompts and
    completions (everything after the prompt: the policy's turns with their stop tokens, the
    environment's replies), whether each stopped at a stop token, the weighted reward, each reward's
    score, per completion token whether the policy wrote it (``masks``; empty: every token), and each
    episode as text (``transcripts``: the prompt's messages, then the policy's turns as ``assistant`` and the
    environment's replies as ``tool``; empty: not kept)."""

    prompts: list[list[int]]
    completions: list[list[int]]
    stopped: list[bool]
    rewards: list[float]
    per_reward: dict[str, list[float]]
    masks: list[list[bool]] = dataclasses.field(default_factory=list)
    transcripts: list[list[dict[str, str]]] = dataclasses.field(default_factory=list)

    def groups(self, size: int) -> list[Rollouts]:
        """One ``Rollouts`` per prompt."""
        return [self._rows(slice(i, i + size)) for i in range(0, len(self.rewards), size)]

    def varied(self) -> bool:
        """Whether the rewards differ (a group whose rewards are all equal has no advantage)."""
        return len(set(self.rewards)) > 1

    def _rows(self, rows: slice) -> Rollouts:
        per_reward = {name: v[rows] for name, v in self.per_reward.items()}
        return Rollouts(
            self.prompts[rows],
            self.completions[rows],
            self.stopped[rows],
            self.rewards[rows],
            per_reward,
            self.masks[rows],
            self.transcripts[rows],
        )

    @staticmethod
    def join(parts: list[Rollouts]) -> Rollouts:
        """The rows of ``parts`` in order."""
        names = parts[0].per_reward
        return Rollouts(
            [p for part in parts for p in part.prompts],
            [c for part in parts for c in part.completions],
            [s for part in parts for s in part.stopped],
            [r for part in parts for r in part.rewards],
            {name: [v for part in parts for v in part.per_reward[name]] for name in names},
            [m for part in parts for m in part.masks],
            [t for part in parts for t in part.transcripts],
        )


#: Per-row batch entries that are logged as their mean (rewards, lengths, rollout timing).
LOGGED = (
    "reward",
    "completion_length",
    "rollout_seconds",
    "rollout_tokens_per_s",
    "rollout_wait_seconds",
    "update_seconds",
    "rollout_share",
    "rollout_staleness",
    "groups_dropped",
    "reward_errors",
    "turns",
)
#: Per-row batch entries of ``rl/pack``, logged as their mean: the share of the packed rows' positions that real
#: tokens take, and how many packed rows the step's passes score (``theseus.training.packing``).
PACK_FILL, PACK_ROWS = "pack_fill", "pack_rows"
#: The per-row batch entry of which completions are solved (``Environment.solved``), logged as ``accuracy``.
SOLVED = "solved"


def rollout_metrics(batch: Batch) -> dict[str, jax.Array]:
    """The means of a rollout's per-row entries (rewards, length, timing), the longest completion, and
    ``accuracy`` where the environment's accuracy reward (``Environment.ACCURACY``) was scored."""
    logged = {
        name: jnp.mean(batch[name])
        for name in batch
        if name in LOGGED or name in (PACK_FILL, PACK_ROWS) or name.startswith("reward/")
    }
    if "completion_length" in batch:
        logged["completion_length_max"] = jnp.max(batch["completion_length"])
    if SOLVED in batch:
        logged["accuracy"] = jnp.mean(batch[SOLVED])
    return logged


def reward_means(done: Rollouts, environment: Environment | None = None) -> dict[str, float]:
    """What validation reports of scored completions: ``reward`` and each reward's mean, and
    ``accuracy`` where ``environment``'s accuracy reward was scored."""
    result = {"reward": float(np.mean(done.rewards))}
    result.update({f"reward/{name}": float(np.mean(v)) for name, v in done.per_reward.items()})
    solved = environment.solved(done.per_reward) if environment is not None else None
    if solved is not None:
        result["accuracy"] = float(np.mean(solved))
    return result


def completion_entropy(entropy: jax.Array, mask: jax.Array) -> jax.Array:
    """The mean over the masked positions of the policy's per-position entropies (nats)."""
    return jnp.sum(entropy * mask) / jnp.maximum(jnp.sum(mask), 1.0)


__all__ = [
    "LOGGED",
    "PACK_FILL",
    "PACK_ROWS",
    "SOLVED",
    "Rollouts",
    "completion_entropy",
    "reward_means",
    "rollout_metrics",
]
