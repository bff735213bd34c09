"""A tiny causal language model and a custom-batch trainer for the trainer tests."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from theseus.base.axis import Axis, MeshAxis, ShardingPlan
from theseus.config import field
from theseus.model.module import Module
from theseus.training.base import BaseTrainer


def masked_cross_entropy(logits: jax.Array, y: jax.Array, padding_mask: jax.Array | None) -> jax.Array:
    """Mean cross-entropy over positions with ``y != -1`` that are not padding."""
    valid = y != -1
    if padding_mask is not None:
        valid = valid & padding_mask
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(logp, jnp.maximum(y, 0)[..., None], axis=-1)[..., 0]
    return -jnp.sum(jnp.where(valid, picked, 0.0)) / jnp.maximum(jnp.sum(valid), 1)


class TinyLM(Module):
    """Token + position embeddings, a causal running-mean mixer, an MLP, dropout and a head."""

    vocab_size: int = field("architecture/vocab_size", default=32)
    block_size: int = field("architecture/block_size", default=16)
    width: int = field("architecture/width", default=32)
    dropout: float = field("architecture/dropout", default=0.0)

    @nn.compact
    def __call__(
        self,
        x: jax.Array,
        y: jax.Array | None = None,
        padding_mask: jax.Array | None = None,
        deterministic: bool = False,
    ) -> tuple[jax.Array, jax.Array | None]:
        dtype = self._activation_dtype
        embed = self.param(
            "embed",
            nn.with_logical_partitioning(nn.initializers.normal(0.5), (Axis.VOCAB, Axis.EMBED)),
            (self.vocab_size, self.width),
            self._param_dtype,
        )
        position = self.param(
            "position",
            nn.with_logical_partitioning(nn.initializers.normal(0.1), (Axis.POSITION, Axis.EMBED)),
            (self.block_size, self.width),
            self._param_dtype,
        )
        h = (embed[x] + position[: x.shape[1]]).astype(dtype)
        h = nn.with_logical_constraint(h, (Axis.BATCH, Axis.SEQUENCE, Axis.EMBED))
        counts = jnp.arange(1, x.shape[1] + 1, dtype=dtype)[None, :, None]
        mixed = jnp.cumsum(h, axis=1) / counts
        hidden = nn.Dense(
            2 * self.width,
            dtype=dtype,
            param_dtype=self._param_dtype,
            kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), (Axis.EMBED, Axis.MLP)),
            name="up",
        )(jnp.concatenate([h, mixed], axis=-1)[..., : self.width] + mixed)
        hidden = nn.gelu(hidden)
        hidden = nn.Dropout(self.dropout)(hidden, deterministic=deterministic)
        out = nn.Dense(
            self.width,
            dtype=dtype,
            param_dtype=self._param_dtype,
            kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), (Axis.MLP, Axis.EMBED)),
            name="down",
        )(hidden)
        h = nn.LayerNorm(dtype=dtype, param_dtype=self._param_dtype, name="norm")(h + out)
        logits = nn.Dense(
            self.vocab_size,
            dtype=dtype,
            param_dtype=self._param_dtype,
            kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), (Axis.EMBED, Axis.VOCAB)),
            name="lm_head",
        )(h)
        loss = None if y is None else masked_cross_entropy(logits, y, padding_mask)
        return logits, loss

    @property
    def sharding(self) -> ShardingPlan:
        return ShardingPlan({Axis.EMBED: MeshAxis.DATA, Axis.MLP: MeshAxis.MODEL, Axis.VOCAB: MeshAxis.MODEL})

    def flops(self, seq: int) -> int:
        w, v = self.width, self.vocab_size
        params = w * 2 * w + 2 * w * w + w * v
        return 6 * params * seq


def counting_batch(seed: int, slice: str, position: int, rows: int, length: int, vocab: int) -> dict[str, np.ndarray]:
    """Rows counting upwards modulo ``vocab`` from random starts: next token = token + 1."""
    rng = np.random.default_rng([seed, 0 if slice == "train" else 1, position])
    starts = rng.integers(0, vocab, size=(rows, 1))
    tokens = (starts + np.arange(length + 1)[None, :]) % vocab
    return {
        "x": tokens[:, :-1].astype(np.int32),
        "y": tokens[:, 1:].astype(np.int32),
        "padding_mask": np.ones((rows, length), bool),
    }


class TinyTrainer(BaseTrainer):
    """Custom batching (DATASET = []): counting sequences, a pure function of (seed, slice, position)."""

    MODEL = TinyLM
    DATASET: Any = []

    def batch(self, slice: str = "train") -> dict[str, np.ndarray]:
        return counting_batch(
            self.args.seed,
            slice,
            self.position(slice),
            self.batch_rows,
            self.sequence_length,
            int(self.setting("architecture/vocab_size")),
        )


class PaddedTinyTrainer(TinyTrainer):
    """Like ``TinyTrainer`` but row ``r`` ends in ``r % 4`` padding positions (mask False, target -1)."""

    def batch(self, slice: str = "train") -> dict[str, np.ndarray]:
        batch = super().batch(slice)
        rows, length = batch["x"].shape
        for row in range(rows):
            pad = row % 4
            if pad:
                batch["padding_mask"][row, length - pad :] = False
                batch["y"][row, length - pad :] = -1
        return batch
