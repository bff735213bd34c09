"""Kimi Delta Attention (KDA, :class:`KimiDeltaAttention`: the ``linear_attention`` layers of Kimi Linear): the
Gated DeltaNet's delta rule with a forget gate per key channel instead of per head. The chunked and recurrent
rules, the short convolutions and the cached decoding state are the Gated DeltaNet's
(:mod:`theseus.model.layers.deltanet`); what differs is the gate's shape and where it comes from::

    g_t    = -exp(A_log) * softplus(f_up(f_down(x_t)) + dt_bias)     # [heads, head_dim], <= 0
    beta_t = sigmoid(b(x_t))                                         # [heads]
    S_t    = diag(exp(g_t)) S_{t-1};  S_t = S_t + k_t (beta_t * (v_t - k_t^T S_t))^T
    y_t    = out(RMSNorm(o_t) * sigmoid(g_up(g_down(x_t))))

with the queries and keys L2-normalised and the queries scaled by ``head_dim ** -0.5``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from theseus.base.axis import Axis
from theseus.errors import ConfigError
from theseus.model.layers._common import cast, child, normal, param
from theseus.model.layers.context_parallel import refuse
from theseus.model.layers.deltanet import GatedDeltaNet
from theseus.model.layers.layer_call import LayerCall
from theseus.model.layers.norms import RMSNorm


class KimiDeltaAttention(GatedDeltaNet):
    """Kimi Linear's ``linear_attention`` layer, called as an attention layer (see :class:`GatedDeltaNet`,
    whose convolutions, chunked and recurrent rules, cache and padding rules it shares). One head count and
    one head width for queries, keys and values (``key_heads == value_heads``, ``key_dim == value_dim``).

    Parameters: ``query`` / ``key`` / ``value`` ``[embed, heads, head_dim]`` and their convolutions
    ``conv_query`` / ``conv_key`` / ``conv_value`` ``[conv_kernel, heads, head_dim]`` (SiLU after); the forget
    gate's low-rank pair ``f_down`` ``[embed, head_dim]`` and ``f_up`` ``[head_dim, heads, head_dim]`` with
    ``dt_bias`` ``[heads, head_dim]`` and ``A_log`` ``[heads]``; ``b`` ``[embed, heads]`` (the write strength);
    the output gate's pair ``g_down`` ``[embed, head_dim]`` and ``g_up`` ``[head_dim, heads, head_dim]``; the
    output norm ``norm`` (an RMSNorm of ``head_dim``, times ``sigmoid`` of the output gate) and ``out``
    ``[heads, head_dim, embed]``. The per-channel decay makes each chunk's pairwise decays ``[C, C, head_dim]``
    (the per-head rule's are ``[C, C]``): ``chunk_size`` bounds that memory.

    LoRA (``model/lora/*``): the targets ``query``, ``key``, ``value`` and ``out`` adapt those projections; the
    gates' low-rank pairs and ``b`` stay frozen.
    """

    KIND: ClassVar[str] = "Kimi Delta Attention (linear attention)"
    LORA_TARGETS: ClassVar[Mapping[str, str]] = {"query": "query", "key": "key", "value": "value", "out": "out"}

    def matmul_params(self) -> int:
        """Projection weights: query, key, value, the two gates' low-rank pairs, ``b`` and ``out``."""
        width, channels, rank = self._width(), self.value_heads * self.value_dim, self.value_dim
        return width * 4 * channels + 2 * (width * rank + rank * channels) + width * self.value_heads

    def _low_rank(self, x: jax.Array, name: str) -> jax.Array:
        """``x`` through ``{name}_down`` ``[embed, head_dim]`` and ``{name}_up`` ``[head_dim, heads, head_dim]``."""
        heads, dim = self.value_heads, self.value_dim
        down = param(self, f"{name}_down", normal(self.init_std), (x.shape[-1], dim), (Axis.EMBED, None))
        up = param(self, f"{name}_up", normal(self.init_std), (dim, heads, dim), (None, Axis.HEADS, Axis.HEAD_DIM))
        low = jnp.einsum("bte,er->btr", x, cast(down, x.dtype))
        return jnp.einsum("btr,rhd->bthd", low, cast(up, x.dtype))

    @nn.compact
    def forward(self, x: jax.Array, call: LayerCall, layer: int | jax.Array | None) -> jax.Array:
        padding_mask, _positions, deterministic, decode = call
        refuse("Kimi Delta Attention (Kimi Linear)")
        heads, dim = self.value_heads, self.value_dim
        if (self.key_heads, self.key_dim) != (heads, dim):
            raise ConfigError(
                f"Kimi Delta Attention has one head shape: key heads {self.key_heads} x {self.key_dim} must equal "
                f"value heads {heads} x {dim}"
            )
        x, mask = self._masked_input(x, padding_mask)
        axes = (Axis.HEADS, Axis.HEAD_DIM)
        q, k, v = (self._proj(x, name, (heads, dim), axes, deterministic) for name in ("query", "key", "value"))
        qkv, state = self._short_conv([q, k, v], decode)
        a_log, dt_bias = self._decay_params((heads, dim))
        f = self._low_rank(x, "f").astype(jnp.float32) + dt_bias
        g = -jnp.exp(a_log)[:, None] * jax.nn.softplus(f)
        beta = jax.nn.sigmoid(self._proj(x, "b", (heads,), (Axis.HEADS,)).astype(jnp.float32))
        y = self._delta_rule(qkv, g, beta, mask, state, decode)
        gate = self._low_rank(x, "g").astype(jnp.float32)
        norm = child(self, RMSNorm, eps=self.norm_eps, zero_centred=False, name="norm")
        y = (norm(y).astype(jnp.float32) * jax.nn.sigmoid(gate)).astype(self._activation_dtype)
        return self._out(y, x.shape[-1], deterministic)


__all__ = ["KimiDeltaAttention"]
