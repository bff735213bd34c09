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


def order_keys(x: jax.Array) -> jax.Array:
    """int32 keys that order float32 values as the floats compare (``-0`` and ``+0`` equal, ``-inf`` lowest)."""
    x = jnp.where(x == 0, jnp.zeros_like(x), x)
    bits = jax.lax.bitcast_convert_type(x, jnp.int32)
    return jnp.where(bits < 0, bits ^ jnp.int32(0x7FFFFFFF), bits)


def filter_top_p(logits: jax.Array, p: float) -> jax.Array:
    """Keep the smallest set of most likely tokens whose probabilities sum to at least ``p``
    (the most likely token is always kept); the rest become ``-inf``.

    A token is kept when the tokens strictly more likely than it hold less than ``p``, so tokens tied
    with the least likely kept one are kept too. The threshold is found by bisection over the order
    keys of the logits (32 masked sums of the probabilities, no sort: XLA's CPU sort made this filter
    cost most of a decoding step); the masses are float32 sums, as a cumulative sum over sorted
    probabilities would be, so the two agree except where a mass lies within float32 rounding of ``p``.
    """
    if p >= 1.0:
        return logits
    values = logits.astype(jnp.float32)
    probs = jax.nn.softmax(values, axis=-1)
    keys = order_keys(values)
    lowest = jnp.min(jnp.where(jnp.isfinite(values), keys, jnp.iinfo(jnp.int32).max), axis=-1)
    highest = jnp.max(keys, axis=-1)  # nothing is strictly more likely: always kept

    def halve(_: int, bounds: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        low, high = bounds  # the least likely kept key lies in [low, high]
        middle = (low & high) + ((low ^ high) >> 1)  # floor of the mean without int32 overflow
        kept = jnp.sum(jnp.where(keys > middle[..., None], probs, 0.0), axis=-1) < p
        return jnp.where(kept, low, middle + 1), jnp.where(kept, middle, high)

    _, threshold = jax.lax.fori_loop(0, 32, halve, (jnp.minimum(lowest, highest), highest))
    return jnp.where(keys >= threshold[..., None], logits, -jnp.inf)


def sample_logits(logits: jax.Array, key: jax.Array, params: SamplingParams) -> jax.Array:
    """One token id (int32) per row of ``logits`` ``[B, V]``: temperature, then top-k, then top-p."""
    logits = logits.astype(jnp.float32)
    if params.greedy:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    scaled = logits / params.temperature
    scaled = filter_top_k(scaled, params.top_k)
    scaled = filter_top_p(scaled, params.top_p)
    return jax.random.categorical(key, scaled, axis=-1).astype(jnp.int32)
