"""``LayerNorm`` and ``RMSNorm``: normalisation over the embedding axis, computed in float32."""

from __future__ import annotations

from dataclasses import dataclass

import flax.linen as nn
import jax
import jax.numpy as jnp

from theseus.base.axis import Axis
from theseus.errors import ConfigError
from theseus.model.layers._common import architecture_field, param
from theseus.model.module import Module

#: ``NormSpec.kind`` values.
NORM_KINDS = ("layernorm", "rmsnorm")
#: ``NormSpec.placement`` values: norms before each branch, after it, both, or neither (a residual scheme
#: that normalises what a branch reads: hyper-connections).
NORM_PLACEMENTS = ("pre", "post", "sandwich", "none")


@dataclass(frozen=True)
class NormSpec:
    """The normalisation layers of every block: ``kind`` (:class:`LayerNorm`, with a bias when
    ``bias``, or :class:`RMSNorm`) of epsilon ``eps``; ``placement`` ``"pre"`` normalises each branch's
    input, ``"post"`` its output before the residual sum (``x + norm(attn(x))``, OLMo 2),
    ``"sandwich"`` both (``x + norm(attn(norm(x)))``, Gemma 2 and 3), ``"none"`` neither (the
    hyper-connections normalise what each branch reads, Qwen4-Exp); ``zero_centred``: every RMSNorm
    multiplies by ``1 + scale``, its scale starting at zeros (Gemma)."""

    kind: str = "rmsnorm"
    eps: float = 1e-5
    placement: str = "pre"
    zero_centred: bool = False
    bias: bool = True

    def validate(self) -> NormSpec:
        if self.kind not in NORM_KINDS:
            raise ConfigError(f"unknown norm {self.kind!r}; use 'layernorm' or 'rmsnorm'")
        if self.placement not in NORM_PLACEMENTS:
            raise ConfigError(f"norm_placement {self.placement!r}: use one of {', '.join(NORM_PLACEMENTS)}")
        return self


class LayerNorm(Module):
    """``(x - mean) / sqrt(var + eps) * scale (+ bias)`` over the last axis.

    Config key: ``architecture/norm_eps``. Parameters ``scale`` (ones) and ``bias`` (zeros, when
    ``use_bias``), both ``[norm]``. Statistics are computed in float32; the output is in the
    activation dtype.
    """

    eps: float = architecture_field("norm_eps")
    use_bias: bool = True

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        features = x.shape[-1]
        scale = param(self, "scale", nn.initializers.ones_init(), (features,), (Axis.NORM,))
        x32 = x.astype(jnp.float32)
        mean = jnp.mean(x32, axis=-1, keepdims=True)
        centered = x32 - mean
        var = jnp.mean(jnp.square(centered), axis=-1, keepdims=True)
        y = centered * jax.lax.rsqrt(var + self.eps) * scale.astype(jnp.float32)
        if self.use_bias:
            y = y + param(self, "bias", nn.initializers.zeros_init(), (features,), (Axis.NORM,)).astype(jnp.float32)
        return y.astype(self._activation_dtype)


class RMSNorm(Module):
    """``x / sqrt(mean(x^2) + eps) * scale`` over the last axis.

    Config key: ``architecture/norm_eps``. Parameter ``scale`` (ones) ``[norm]``. Computed in
    float32; the output is in the activation dtype. ``zero_centred``: ``scale`` starts at zeros and
    multiplies as ``1 + scale`` (Gemma's norms; the checkpoint's weight is stored as it is).
    """

    eps: float = architecture_field("norm_eps")
    zero_centred: bool = False

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        init = nn.initializers.zeros_init() if self.zero_centred else nn.initializers.ones_init()
        scale = param(self, "scale", init, (x.shape[-1],), (Axis.NORM,)).astype(jnp.float32)
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.eps)
        return (y * (1.0 + scale if self.zero_centred else scale)).astype(self._activation_dtype)
