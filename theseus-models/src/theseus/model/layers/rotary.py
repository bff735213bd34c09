"""``RotaryEmbedding``: rotary position embedding (RoPE) of queries and keys."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from theseus.errors import ConfigError
from theseus.model.module import Module


def rotary_angles(positions: jax.Array, head_dim: int, theta: float) -> jax.Array:
    """Rotation angles ``[..., head_dim // 2]`` (float32) of integer ``positions``."""
    exponents = jnp.arange(0, head_dim // 2, dtype=jnp.float32) * (2.0 / head_dim)
    inv_freq = 1.0 / (theta**exponents)
    return positions.astype(jnp.float32)[..., None] * inv_freq


class RotaryEmbedding(Module):
    """Rotates ``[batch, seq, heads, head_dim]`` queries/keys by their positions.

    Uses the half-split convention: the first and second halves of ``head_dim`` form the
    (real, imaginary) pairs rotated by ``position * theta ** (-2i / head_dim)``. Computed
    in float32 and returned in the input dtype. No parameters and no configuration keys
    (the attention layer passes ``theta``).
    """

    theta: float = 10000.0

    def __call__(self, x: jax.Array, positions: jax.Array | None = None) -> jax.Array:
        """``x``: ``[B, T, N, H]``; ``positions``: int ``[B, T]`` (or ``[1, T]``), default ``0..T-1``."""
        head_dim = x.shape[-1]
        if head_dim % 2:
            raise ConfigError(
                f"rotary embedding needs an even head dimension, got {head_dim}; change n_embd or n_heads"
            )
        if positions is None:
            positions = jnp.arange(x.shape[1], dtype=jnp.int32)[None, :]
        angles = rotary_angles(positions, head_dim, self.theta)[:, :, None, :]  # [B, T, 1, H/2]
        cos, sin = jnp.cos(angles), jnp.sin(angles)
        half = head_dim // 2
        x32 = x.astype(jnp.float32)
        first, second = x32[..., :half], x32[..., half:]
        rotated = jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)
        return rotated.astype(x.dtype)
