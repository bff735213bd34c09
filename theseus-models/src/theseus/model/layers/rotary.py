"""``RotaryEmbedding``: rotary position embedding (RoPE) of queries and keys, with optional scaling."""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from theseus.errors import ConfigError
from theseus.model.module import Module

#: Supported ``architecture/rope_scaling`` kinds.
ROPE_SCALINGS = ("none", "linear", "llama3")


@dataclass(frozen=True)
class RopeScaling:
    """How rotary frequencies are stretched for contexts longer than the ones trained on.

    ``none``: plain RoPE. ``linear``: every frequency divided by ``factor`` (positions
    interpolated). ``llama3``: Llama 3.1's scheme: wavelengths longer than
    ``original_max_positions / low_freq_factor`` are divided by ``factor``, shorter than
    ``original_max_positions / high_freq_factor`` kept, and those in between interpolated.
    """

    kind: str = "none"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_positions: int = 8192

    def validate(self) -> RopeScaling:
        if self.kind not in ROPE_SCALINGS:
            raise ConfigError(
                f"unknown architecture/rope_scaling {self.kind!r}; choose one of {', '.join(ROPE_SCALINGS)}"
            )
        if self.kind != "none" and not self.factor > 0:
            raise ConfigError(f"architecture/rope_factor must be positive, got {self.factor}")
        if self.kind == "llama3" and not self.high_freq_factor > self.low_freq_factor > 0:
            raise ConfigError(
                "llama3 rope scaling needs architecture/rope_high_freq_factor > architecture/rope_low_freq_factor > 0, "
                f"got {self.high_freq_factor} and {self.low_freq_factor}"
            )
        return self

    def apply(self, inv_freq: jax.Array) -> jax.Array:
        """The scaled inverse frequencies (float32)."""
        if self.kind == "linear":
            return inv_freq / self.factor
        if self.kind != "llama3":
            return inv_freq
        wavelength = 2.0 * math.pi / inv_freq
        low_wavelength = self.original_max_positions / self.low_freq_factor
        high_wavelength = self.original_max_positions / self.high_freq_factor
        smooth = (self.original_max_positions / wavelength - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor
        )
        interpolated = (1.0 - smooth) * inv_freq / self.factor + smooth * inv_freq
        scaled = jnp.where(wavelength > low_wavelength, inv_freq / self.factor, inv_freq)
        medium = (wavelength >= high_wavelength) & (wavelength <= low_wavelength)
        return jnp.where(medium, interpolated, scaled)


def rotary_angles(positions: jax.Array, head_dim: int, theta: float, scaling: RopeScaling | None = None) -> jax.Array:
    """Rotation angles ``[..., head_dim // 2]`` (float32) of integer ``positions``."""
    exponents = jnp.arange(0, head_dim // 2, dtype=jnp.float32) * (2.0 / head_dim)
    inv_freq = 1.0 / (theta**exponents)
    if scaling is not None:
        inv_freq = scaling.apply(inv_freq)
    return positions.astype(jnp.float32)[..., None] * inv_freq


class RotaryEmbedding(Module):
    """Rotates ``[batch, seq, heads, head_dim]`` queries/keys by their positions.

    Uses the half-split convention: the first and second halves of ``head_dim`` form the
    (real, imaginary) pairs rotated by ``position * theta ** (-2i / head_dim)`` (frequencies
    stretched by ``scaling`` when given, see :class:`RopeScaling`). Computed in float32 and
    returned in the input dtype. No parameters and no configuration keys (the attention layer
    passes ``theta`` and ``scaling``).
    """

    theta: float = 10000.0
    scaling: RopeScaling | None = None

    def __call__(self, x: jax.Array, positions: jax.Array | None = None) -> jax.Array:
        """``x``: ``[B, T, N, H]``; ``positions``: int ``[B, T]`` (or ``[1, T]``), default ``0..T-1``."""
        head_dim = x.shape[-1]
        if head_dim % 2:
            raise ConfigError(
                f"rotary embedding needs an even head dimension, got {head_dim}; change n_embd or n_heads"
            )
        if positions is None:
            positions = jnp.arange(x.shape[1], dtype=jnp.int32)[None, :]
        angles = rotary_angles(positions, head_dim, self.theta, self.scaling)[:, :, None, :]  # [B, T, 1, H/2]
        cos, sin = jnp.cos(angles), jnp.sin(angles)
        half = head_dim // 2
        x32 = x.astype(jnp.float32)
        first, second = x32[..., :half], x32[..., half:]
        rotated = jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)
        return rotated.astype(x.dtype)
