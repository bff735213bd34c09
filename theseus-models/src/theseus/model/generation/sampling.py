"""Choosing the next token from logits: temperature, top-k and top-p (nucleus) sampling."""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from theseus.errors import ConfigError


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are drawn. ``temperature == 0`` is greedy (top-k and top-p are then ignored);
    ``top_k == 0`` and ``top_p == 1`` switch those filters off. Hashable: a static jit argument."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)) or self.temperature < 0:
            raise ConfigError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ConfigError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not (isinstance(self.top_p, (int, float)) and 0.0 < self.top_p <= 1.0):
            raise ConfigError(f"top_p must lie in (0, 1] (1 = off), got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def describe(self) -> str:
        if self.greedy:
            return "greedy"
        parts = [f"temperature {self.temperature:g}"]
        if self.top_k:
            parts.append(f"top-k {self.top_k}")
        if self.top_p < 1.0:
            parts.append(f"top-p {self.top_p:g}")
        return ", ".join(parts)


def filter_top_k(logits: jax.Array, k: int) -> jax.Array:
    """``logits`` ``[..., V]`` with everything below the ``k``-th largest value set to ``-inf``."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = jax.lax.top_k(logits, k)[0][..., -1:]
    return jnp.where(logits < kth, -jnp.inf, logits)


def filter_top_p(logits: jax.Array, p: float) -> jax.Array:
    """Keep the smallest set of most likely tokens whose probabilities sum to at least ``p``
    (the most likely token is always kept); the rest become ``-inf``."""
    if p >= 1.0:
        return logits
    ordered = jnp.sort(logits, axis=-1)[..., ::-1]
    probs = jax.nn.softmax(ordered, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # probability mass of strictly more likely tokens
    keep = before < p
    threshold = jnp.min(jnp.where(keep, ordered, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(logits < threshold, -jnp.inf, logits)


def sample_logits(logits: jax.Array, key: jax.Array, params: SamplingParams) -> jax.Array:
    """One token id (int32) per row of ``logits`` ``[B, V]``: temperature, then top-k, then top-p."""
    logits = logits.astype(jnp.float32)
    if params.greedy:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    scaled = logits / params.temperature
    scaled = filter_top_k(scaled, params.top_k)
    scaled = filter_top_p(scaled, params.top_p)
    return jax.random.categorical(key, scaled, axis=-1).astype(jnp.int32)
