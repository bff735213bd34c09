"""Log-probabilities of target tokens under a model's logits: the one computation behind the training
loss, evaluation scoring, the harness, preference objectives and reinforcement learning.

``logits`` ``[..., T, V]`` (any float dtype; computed in float32) score ``targets`` int ``[..., T]``.
A position is scored where its target is not :data:`IGNORED` and ``mask`` (bool ``[..., T]``, True =
real token), when given, is True; an unscored position's log-probability is 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

#: The target of a position that is not scored.
IGNORED = -1


def scored_positions(targets: ArrayLike, mask: ArrayLike | None = None) -> jax.Array:
    """Bool ``[..., T]``: the positions whose target counts (not :data:`IGNORED`, within ``mask``)."""
    scored = jnp.asarray(targets) != IGNORED
    return scored if mask is None else scored & jnp.asarray(mask, jnp.bool_)


def token_logps(logits: ArrayLike, targets: ArrayLike, mask: ArrayLike | None = None) -> jax.Array:
    """``log p(target)`` at each position, float32 ``[..., T]`` (0 where the position is not scored)."""
    logits = jnp.asarray(logits, jnp.float32)
    scored = scored_positions(targets, mask)
    # the target's logit by select-and-sum over the vocabulary, not a gather: exact, and it partitions where
    # the vocabulary is split over devices inside a pipeline stage (XLA cannot partition that gather)
    chosen = jnp.arange(logits.shape[-1], dtype=jnp.int32) == jnp.asarray(targets, jnp.int32)[..., None]
    picked = jnp.sum(jnp.where(chosen, logits, 0.0), axis=-1)
    return jnp.where(scored, picked - jax.nn.logsumexp(logits, axis=-1), 0.0)


def sequence_logps(logits: ArrayLike, targets: ArrayLike, mask: ArrayLike | None = None) -> tuple[jax.Array, jax.Array]:
    """``(sum of log p(target), number of scored targets)`` of each row, both float32 ``[...]``."""
    total = jnp.sum(token_logps(logits, targets, mask), axis=-1)
    return total, jnp.sum(scored_positions(targets, mask), axis=-1).astype(jnp.float32)


def cross_entropy(logits: ArrayLike, targets: ArrayLike, mask: ArrayLike | None = None) -> jax.Array:
    """Mean token cross-entropy (float32): the mean of ``-log p(target)`` over the scored positions;
    0 when none is scored."""
    scored = scored_positions(targets, mask)
    nll = jnp.where(scored, -token_logps(logits, targets, mask), 0.0)
    return jnp.sum(nll) / jnp.maximum(jnp.sum(scored), 1).astype(jnp.float32)


__all__ = ["IGNORED", "cross_entropy", "scored_positions", "sequence_logps", "token_logps"]
