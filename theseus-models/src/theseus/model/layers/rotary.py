"""``RotaryEmbedding``: rotary position embedding (RoPE) of queries and keys, with optional scaling."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from theseus.errors import ConfigError
from theseus.model.module import Module

#: Supported ``architecture/rope_scaling`` kinds.
ROPE_SCALINGS = ("none", "linear", "llama3", "longrope", "yarn")
#: ``PositionSpec.kind`` values: rotary queries and keys, a learned position embedding, or none.
POSITION_KINDS = ("rope", "learned", "none")


@dataclass(frozen=True)
class RopeScaling:
    """How rotary frequencies are stretched for contexts longer than the ones trained on.

    ``none``: plain RoPE. ``linear``: every frequency divided by ``factor`` (positions
    interpolated). ``llama3``: Llama 3.1's scheme: wavelengths longer than
    ``original_max_positions / low_freq_factor`` are divided by ``factor``, shorter than
    ``original_max_positions / high_freq_factor`` kept, and those in between interpolated.
    ``longrope``: Phi-3's LongRoPE: frequency ``i`` divided by ``short_factor[i]`` while a sequence
    fits ``original_max_positions`` and by ``long_factor[i]`` once it is longer (chosen per call from
    the largest position, as transformers does), and queries and keys scaled by ``attention_factor``.
    ``yarn``: YaRN (NTK-by-parts): frequencies that turn fewer than ``beta_slow`` times over
    ``original_max_positions`` are divided by ``factor``, those turning more than ``beta_fast`` times
    kept, a linear ramp between (its ends rounded outward when ``truncate``); queries and keys scaled by
    ``attention_factor`` (None: ``0.1 * ln(factor) + 1``, the paper's).
    """

    kind: str = "none"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_positions: int = 8192
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    attention_factor: float | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True

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
        if self.kind == "longrope":
            factors = (*self.short_factor, *self.long_factor)
            if not self.short_factor or len(self.short_factor) != len(self.long_factor) or min(factors) <= 0:
                raise ConfigError(
                    "longrope rope scaling needs architecture/rope_short_factor and rope_long_factor: "
                    f"positive lists of one length, got {list(self.short_factor)} and {list(self.long_factor)}"
                )
        if self.kind in ("longrope", "yarn") and self.attention_factor is not None and not self.attention_factor > 0:
            raise ConfigError(f"architecture/rope_attention_factor must be positive, got {self.attention_factor}")
        if self.kind == "yarn" and not self.beta_fast > self.beta_slow > 0:
            raise ConfigError(
                "yarn rope scaling needs architecture/rope_beta_fast > architecture/rope_beta_slow > 0, "
                f"got {self.beta_fast} and {self.beta_slow}"
            )
        return self

    @property
    def magnitude(self) -> float:
        """What rotated queries and keys are multiplied by (longrope's and yarn's attention factor, else 1)."""
        if self.kind == "yarn":
            return yarn_mscale(self.factor) if self.attention_factor is None else self.attention_factor
        if self.kind == "longrope":
            return 1.0 if self.attention_factor is None else self.attention_factor
        return 1.0

    def apply(
        self, inv_freq: jax.Array, seq_len: jax.Array | None = None, theta: float | jax.Array = 10000.0
    ) -> jax.Array:
        """The scaled inverse frequencies (float32) of base ``theta``; longrope's depend on ``seq_len``
        (the largest position + 1; None: the short factors)."""
        if self.kind == "yarn":
            return self._yarn(inv_freq, theta)
        if self.kind == "longrope":
            if len(self.short_factor) != inv_freq.shape[-1]:
                raise ConfigError(
                    f"longrope needs one factor per rotary frequency (head_dim / 2 = {inv_freq.shape[-1]}), "
                    f"got {len(self.short_factor)}; fix architecture/rope_short_factor and rope_long_factor"
                )
            short = inv_freq / jnp.asarray(self.short_factor, jnp.float32)
            if seq_len is None:
                return short
            long = inv_freq / jnp.asarray(self.long_factor, jnp.float32)
            return jnp.where(seq_len > self.original_max_positions, long, short)
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

    def _yarn(self, inv_freq: jax.Array, theta: float | jax.Array) -> jax.Array:
        dim = 2 * inv_freq.shape[-1]
        log_theta = jnp.log(jnp.asarray(theta, jnp.float32))

        def boundary(rotations: float) -> jax.Array:
            """The frequency index that turns ``rotations`` times over the original context."""
            return dim * math.log(self.original_max_positions / (rotations * 2 * math.pi)) / (2 * log_theta)

        low, high = boundary(self.beta_fast), boundary(self.beta_slow)
        if self.truncate:
            low, high = jnp.floor(low), jnp.ceil(high)
        low, high = jnp.maximum(low, 0.0), jnp.minimum(high, dim - 1.0)
        high = jnp.where(low == high, high + 0.001, high)
        ramp = jnp.clip((jnp.arange(dim // 2, dtype=jnp.float32) - low) / (high - low), 0.0, 1.0)
        return inv_freq / self.factor * ramp + inv_freq * (1.0 - ramp)


@dataclass(frozen=True)
class PositionSpec:
    """How tokens learn their positions: ``kind`` ``"rope"`` (queries and keys rotated with base
    ``theta``, stretched by ``scaling``), ``"learned"`` (a position embedding added to the tokens') or
    ``"none"``. ``local_theta``: the base of the sliding-window layers when the model has
    ``layer_types`` (None: ``theta``); those layers rotate without ``scaling`` (Gemma 3)."""

    kind: str = "rope"
    theta: float = 10000.0
    scaling: RopeScaling = RopeScaling()
    local_theta: float | None = None

    @property
    def rotary(self) -> bool:
        return self.kind == "rope"

    @property
    def scaled(self) -> RopeScaling | None:
        """``scaling``, or None when it is ``"none"`` (plain RoPE)."""
        return None if self.scaling.kind == "none" else self.scaling

    @property
    def local(self) -> float:
        """The base of the sliding-window layers."""
        return self.theta if self.local_theta is None else self.local_theta

    def validate(self) -> PositionSpec:
        if self.kind not in POSITION_KINDS:
            raise ConfigError(f"unknown position kind {self.kind!r}; use one of {', '.join(POSITION_KINDS)}")
        self.scaling.validate()
        if self.local_theta is not None and not self.local_theta > 0:
            raise ConfigError(f"architecture/rope_local_theta must be positive or null, got {self.local_theta!r}")
        return self


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction ``0.1 * mscale * ln(factor) + 1`` (1 for ``factor`` <= 1)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rotary_angles(
    positions: jax.Array, head_dim: int, theta: float | jax.Array, scaling: RopeScaling | None = None
) -> jax.Array:
    """Rotation angles ``[..., head_dim // 2]`` (float32) of integer ``positions``; ``theta`` may be a
    traced scalar (a base chosen per layer inside a scan)."""
    exponents = jnp.arange(0, head_dim // 2, dtype=jnp.float32) * (2.0 / head_dim)
    inv_freq = 1.0 / (theta**exponents)
    if scaling is not None:
        inv_freq = scaling.apply(inv_freq, jnp.max(positions) + 1 if scaling.kind == "longrope" else None, theta)
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
        return rotate(x, positions, self.theta, self.scaling)


def rotate(
    x: jax.Array,
    positions: jax.Array | None,
    theta: float | jax.Array,
    scaling: RopeScaling | None = None,
    turning: int | None = None,
) -> jax.Array:
    """:class:`RotaryEmbedding`'s rotation as a function: ``theta`` may be traced (a base per layer).
    ``turning``: only the first that many of the ``head_dim / 2`` pairs turn, the others have frequency 0
    (proportional RoPE, :func:`proportional_pairs`); the frequencies stay those of the whole head."""
    half = x.shape[-1] // 2
    angles = head_angles(x, positions, theta, scaling)
    if turning is not None and turning < half:
        angles = jnp.where(jnp.arange(half) < turning, angles, 0.0)
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    x32 = x.astype(jnp.float32)
    first, second = x32[..., :half], x32[..., half:]
    rotated = jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)
    return magnified(rotated, scaling, x)


def head_angles(
    x: jax.Array, positions: jax.Array | None, theta: float | jax.Array, scaling: RopeScaling | None
) -> jax.Array:
    """The angles ``[B, T, 1, head_dim / 2]`` that rotate ``x`` ``[B, T, N, head_dim]`` at ``positions``
    (None: 0, 1, ...); one line for an odd head dimension."""
    head_dim = x.shape[-1]
    if head_dim % 2:
        raise ConfigError(f"rotary embedding needs an even head dimension, got {head_dim}; change n_embd or n_heads")
    if positions is None:
        positions = jnp.arange(x.shape[1], dtype=jnp.int32)[None, :]
    return rotary_angles(positions, head_dim, theta, scaling)[:, :, None, :]


def magnified(rotated: jax.Array, scaling: RopeScaling | None, x: jax.Array) -> jax.Array:
    """``rotated`` (float32) times the scaling's magnitude (longrope, yarn), in ``x``'s dtype."""
    if scaling is not None and scaling.magnitude != 1.0:
        rotated = rotated * scaling.magnitude
    return rotated.astype(x.dtype)


def proportional_pairs(head_dim: int, fraction: float) -> int:
    """The pairs that turn in proportional RoPE (Gemma 4's full layers): the first ``fraction`` of a head's
    ``head_dim / 2`` half-split pairs, each at its whole-head frequency ``theta ** (-2i / head_dim)``; the
    rest keep frequency 0 (unlike a partial rotary that rotates the leading dimensions as a head of their own)."""
    if not 0.0 <= fraction <= 1.0:
        raise ConfigError(f"architecture/partial_rotary_factor={fraction} must be in [0, 1]")
    return int(fraction * head_dim // 2)


def rope_layer_flags(flags: Sequence[int] | None, n_layers: int, every: int) -> tuple[bool, ...]:
    """Per layer, whether it rotates its queries and keys: ``flags`` (transformers' ``no_rope_layers``,
    1 = RoPE, 0 = NoPE, at least one per layer), or for None every ``every``-th layer NoPE (the last of
    each ``every``)."""
    if flags is None:
        if every < 1:
            raise ConfigError(f"architecture/no_rope_layer_interval={every} must be a positive integer")
        return tuple((i + 1) % every != 0 for i in range(n_layers))
    given = list(flags)
    if len(given) < n_layers or not set(given) <= {0, 1}:
        raise ConfigError(
            f"architecture/no_rope_layers={given} must give 1 (RoPE) or 0 (NoPE) for each of {n_layers} layers"
        )
    return tuple(bool(flag) for flag in given[:n_layers])
