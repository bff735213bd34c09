"""``TokenEmbedding`` and ``PositionEmbedding``: learned lookup tables."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from theseus.base.axis import Axis, MeshAxis, ShardingPlan
from theseus.model.layers._common import INIT_STD, architecture_field, cast, normal, param, require
from theseus.model.module import Module


class TokenEmbedding(Module):
    """Token id -> vector lookup; ``attend(x)`` reuses the table as an output head (tied weights).

    Config keys: ``architecture/vocab_size``, ``architecture/n_embd`` (required when used alone).
    Parameter ``embedding`` ``[vocab, embed]``. A lookup has no matmul FLOPs; the tied head's
    ``2 * n_embd * vocab_size`` per token is counted by the model that calls ``attend``.
    """

    vocab_size: int = architecture_field("vocab_size")
    n_embd: int | None = architecture_field("n_embd")
    init_std: float = INIT_STD

    @property
    def sharding(self) -> ShardingPlan:
        return ShardingPlan({Axis.VOCAB: MeshAxis.MODEL, Axis.EMBED: MeshAxis.DATA})

    def setup(self) -> None:
        n_embd = require(self.n_embd, "architecture/n_embd", "TokenEmbedding")
        self.embedding = param(
            self, "embedding", normal(self.init_std), (self.vocab_size, n_embd), (Axis.VOCAB, Axis.EMBED)
        )

    def __call__(self, ids: jax.Array) -> jax.Array:
        """``ids`` int ``[...]`` -> ``[..., n_embd]`` in the activation dtype."""
        return cast(jnp.take(self.embedding, ids, axis=0), self._activation_dtype)

    def attend(self, x: jax.Array) -> jax.Array:
        """Logits ``x @ embedding.T`` in float32 (``[..., n_embd]`` -> ``[..., vocab]``)."""
        dtype = self._activation_dtype
        return jnp.einsum(
            "...e,ve->...v", cast(x, dtype), cast(self.embedding, dtype), preferred_element_type=jnp.float32
        )


class PositionEmbedding(Module):
    """Learned absolute position embedding (GPT-2).

    Config keys: ``architecture/block_size`` (table length = maximum sequence length),
    ``architecture/n_embd``. Parameter ``embedding`` ``[position, embed]``.
    """

    block_size: int = architecture_field("block_size")
    n_embd: int | None = architecture_field("n_embd")
    init_std: float = INIT_STD

    @property
    def sharding(self) -> ShardingPlan:
        return ShardingPlan({Axis.EMBED: MeshAxis.DATA})

    @nn.compact
    def __call__(self, positions: jax.Array | int) -> jax.Array:
        """``positions`` int ``[B, T]`` -> ``[B, T, n_embd]``; an int ``T`` gives ``[1, T, n_embd]`` for ``0..T-1``."""
        n_embd = require(self.n_embd, "architecture/n_embd", "PositionEmbedding")
        table = param(self, "embedding", normal(self.init_std), (self.block_size, n_embd), (Axis.POSITION, Axis.EMBED))
        if isinstance(positions, int):
            return cast(table[None, :positions], self._activation_dtype)
        return cast(jnp.take(table, positions, axis=0), self._activation_dtype)
