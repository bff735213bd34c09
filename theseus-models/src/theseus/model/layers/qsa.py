"""Block-selected attention (Qwen4-Exp's QSA): an indexer chooses, for each query, the blocks of keys its
attention layer reads.

The indexer projects the layer input to ``heads`` query heads and one key of ``head_dim`` per token
(``query_key`` ``[embed, heads + 1, head_dim]``). The keys of each ``ratio`` consecutive real tokens
form a block, averaged, RMS-normalised (``key_norm``, zero-centred) and rotated at the position of the
block's first token; the queries are normalised (``query_norm``) and rotated at their own positions
(the leading ``rotary_dim`` dimensions, as the attention's partial RoPE). A query scores each block it
has seen whole as ``sum_h relu(q_h . k) / sqrt(head_dim)``, keeps the ``budget / ratio`` best, and
attends to their tokens and to the tokens after its last whole block; the rest are masked. With fewer
whole blocks than that, every token is kept and the attention is the dense one. In decoding the indexer
caches its keys (``cache`` ``key`` ``[B, L, head_dim]``) beside the attention's.

The attention is computed as masked dense attention (the unselected keys masked), as transformers does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import flax.linen as nn
import jax
import jax.numpy as jnp

from theseus.base.axis import Axis
from theseus.errors import ConfigError
from theseus.model.layers._common import INIT_STD, cast, normal, param
from theseus.model.layers.attention import append_to_cache
from theseus.model.layers.rotary import RopeScaling, rotate
from theseus.model.module import Module


@dataclass(frozen=True)
class QSASpec:
    """The indexer's ``heads`` query heads of ``head_dim``, its token ``budget`` and block ``ratio``."""

    heads: int
    head_dim: int
    budget: int
    ratio: int

    @property
    def blocks(self) -> int:
        """Blocks each query keeps."""
        return self.budget // self.ratio

    def validate(self, rotary_dim: int) -> QSASpec:
        for key, value in (
            ("indexer_n_heads", self.heads),
            ("indexer_head_dim", self.head_dim),
            ("indexer_budget", self.budget),
            ("indexer_compress_ratio", self.ratio),
        ):
            if value < 1:
                raise ConfigError(f"architecture/{key}={value} must be positive")
        if self.budget % self.ratio:
            raise ConfigError(
                f"architecture/indexer_budget={self.budget} must be a multiple of indexer_compress_ratio={self.ratio}"
            )
        if rotary_dim > self.head_dim:
            raise ConfigError(
                f"architecture/indexer_head_dim={self.head_dim} must hold the attention's "
                f"{rotary_dim} rotated dimensions"
            )
        return self


def _zero_centred_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
    return normed * (1.0 + scale.astype(jnp.float32))


class QSAIndexer(Module):
    """The indexer (module docstring): called with the layer input ``x`` ``[B, T, embed]``, the queries'
    positions, the step's padding mask and ``decode``, it returns the selection ``[B, 1, T, L]`` (True:
    attended) over the ``L`` keys the attention sees."""

    spec: QSASpec | None = None
    rotary_dim: int = 0
    theta: float = 10000.0
    scaling: RopeScaling | None = None
    eps: float = 1e-6

    def _turn(self, x: jax.Array, positions: jax.Array) -> jax.Array:
        rot = self.rotary_dim
        head = rotate(x[..., :rot], positions, self.theta, self.scaling)
        return jnp.concatenate([head, x[..., rot:].astype(head.dtype)], axis=-1)

    @nn.compact
    def __call__(
        self, x: jax.Array, positions: jax.Array | None, padding_mask: jax.Array | None, decode: bool
    ) -> jax.Array | None:
        if self.spec is None:
            raise ConfigError("QSAIndexer needs a QSASpec; it is built by a model with an indexer")
        spec = self.spec
        batch, steps = x.shape[:2]
        kernel = param(
            self, "query_key", normal(INIT_STD), (x.shape[-1], spec.heads + 1, spec.head_dim), (Axis.EMBED, None, None)
        )
        both = jnp.einsum("bte,ehd->bthd", x, cast(kernel, x.dtype))
        q, raw = both[:, :, : spec.heads], both[:, :, spec.heads]
        query_scale = param(self, "query_norm", nn.initializers.zeros_init(), (spec.head_dim,), (None,))
        key_scale = param(self, "key_norm", nn.initializers.zeros_init(), (spec.head_dim,), (None,))
        step_mask = jnp.ones((batch, steps), jnp.bool_) if padding_mask is None else padding_mask.astype(jnp.bool_)
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(steps, dtype=jnp.int32), (batch, steps))
        q = self._turn(_zero_centred_norm(q, query_scale, self.eps), positions)
        keys, key_real = raw, step_mask
        if decode:
            held = append_to_cache(self, {"key": raw}, padding_mask, time_axis=1)
            if held is None:
                return None
            keys = held[0]
            key_real = self.get_variable("cache", "mask")[:, : keys.shape[1]]
        key_ranks = jnp.cumsum(key_real.astype(jnp.int32), axis=1) - 1
        return self._select(q, keys, key_ranks, key_real, positions, key_scale)

    def _select(
        self,
        q: jax.Array,
        keys: jax.Array,
        key_ranks: jax.Array,
        key_real: jax.Array,
        query_ranks: jax.Array,
        key_scale: jax.Array,
    ) -> jax.Array:
        """The selection ``[B, 1, T, L]`` of queries ``q`` (normed, rotated) over raw ``keys`` ``[B, L, d]``."""
        spec = self.spec
        assert spec is not None
        batch, slots = keys.shape[:2]
        count = slots // spec.ratio
        if count == 0:
            return jnp.ones((batch, 1, q.shape[1], slots), jnp.bool_)
        block_of = key_ranks // spec.ratio  # [B, L]
        member = (key_real[..., None] & (block_of[..., None] == jnp.arange(count))).astype(jnp.float32)  # [B, L, C]
        pooled = jnp.einsum("blc,bld->bcd", member, keys.astype(jnp.float32)) / spec.ratio
        pooled = _zero_centred_norm(pooled, key_scale, self.eps)[:, :, None, :]
        starts = jnp.broadcast_to(jnp.arange(count, dtype=jnp.int32) * spec.ratio, (batch, count))
        blocks = self._turn(pooled, starts)[:, :, 0, :]
        scores = jnp.einsum("bthd,bcd->bthc", q.astype(jnp.float32), blocks.astype(jnp.float32))
        scores = jnp.sum(jax.nn.relu(scores), axis=2) / math.sqrt(spec.head_dim)  # [B, T, C]
        whole = (query_ranks + 1) // spec.ratio  # [B, T]: the blocks each query has seen whole
        valid = jnp.arange(count) < whole[..., None]
        keep = min(spec.blocks, count)
        _, best = jax.lax.top_k(jnp.where(valid, scores, -jnp.inf), keep)
        chosen = jnp.any(best[..., None] == jnp.arange(count), axis=-2) & valid  # [B, T, C]
        block_index = jnp.clip(block_of, 0, count - 1)[:, None, :]  # [B, 1, L]
        picked = jnp.take_along_axis(chosen, jnp.broadcast_to(block_index, (*chosen.shape[:2], slots)), axis=-1)
        tail = block_of[:, None, :] >= whole[..., None]
        return (picked | tail)[:, None]


__all__ = ["QSAIndexer", "QSASpec"]
