"""DeepSeek Sparse Attention (DSA, DeepSeek-V3.2): a lightning indexer chooses, for each query, the
``index_topk`` keys that multi-head latent attention attends to.

:class:`LightningIndexer` is the indexer and its top-k selection, one layer. It has its own small
projections: the query ``[B, T, index_n_heads, index_head_dim]`` from the latent attention's normalised
low-rank query (``query``), one key per token ``[B, T, index_head_dim]`` from the layer input (``key``,
then a LayerNorm with bias, ``key_norm``), and a weight per head and token (``weights``, ``[embed,
index_n_heads]``, computed in float32 and scaled by ``index_n_heads ** -0.5``). The first
``qk_rope_head_dim`` dimensions of the query and key are rotated with the model's RoPE (as halves for
DeepSeek-V3.2; as interleaved pairs with ``rope_interleave``, GLM-5). A query ``t`` scores key ``s`` as

    I[t, s] = sum_h w[t, h] * ReLU(q[t, h] . k[s] * index_head_dim ** -0.5)

and keeps the ``index_topk`` best keys among those it may see (causal, not padding, its own packed
example); with fewer visible keys than ``index_topk`` it keeps all of them, and sparse attention is the
dense one. The reference implementation also applies a Hadamard transform to the query and key and
scores in FP8; the transform is orthogonal (dot products unchanged) and FP8 a precision choice, so,
as transformers does, neither is applied. In KV-cache generation the indexer caches its keys (``key``
``[B, L, index_head_dim]``) beside the latent attention's latents.

:class:`SparseLatentAttention` is :class:`~theseus.model.layers.latent_attention.LatentAttention`
with the indexer as its child ``indexer``. ``architecture/dsa/phase`` selects the stage of the
published training recipe:

- ``dense_warmup``: attention stays dense (every visible key) and the indexer learns to imitate it;
- ``sparse`` (the default, and what the released checkpoints run): each query attends to its top-k keys.

In both the indexer's inputs are detached from the main model (``stop_gradient``), so the indexer
learns only from its own loss and the main model only from the language-modelling loss (the selection
is discrete: no gradient reaches the indexer through it). The indexer loss (:func:`indexer_loss`) is
the paper's: the target ``p[t, :]`` is the main attention's probabilities summed over heads and
L1-normalised over the keys, and ``L = sum_t KL(p[t, S_t] || softmax(I[t, S_t]))`` with ``S_t`` every
visible key in the warm-up and the selected keys in the sparse stage. A layer sows
``model/dsa/indexer_loss_weight`` times its ``L`` divided by the number of real query tokens as the
auxiliary loss ``indexer_loss`` and that mean as the metric ``indexer_kl``.

The attention is computed as masked dense attention (scores over the whole sequence, the unselected
keys masked), as transformers' eager path does: the same outputs, none of a sparse kernel's savings.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from theseus.base.sown import AUX_LOSSES, AUX_METRICS
from theseus.config import field
from theseus.errors import ConfigError
from theseus.model.layers._common import INIT_STD, cast, child, normal, optional_key, param, require
from theseus.model.layers.attention import append_to_cache, attention_mask, is_segment_ids
from theseus.model.layers.latent_attention import LatentAttention, MLAInputs, MLASpec, deinterleave
from theseus.model.layers.matmul import project
from theseus.model.layers.norms import LayerNorm
from theseus.model.layers.rotary import PositionSpec, RopeScaling, rotate
from theseus.model.module import Module

#: The stages of the training recipe ``architecture/dsa/phase`` chooses between.
DSA_PHASES = ("dense_warmup", "sparse")
#: The indexer key's LayerNorm epsilon (fixed by the releases).
INDEXER_NORM_EPS = 1e-6
#: The sown auxiliary loss and logged metric of the indexer.
INDEXER_AUX_LOSS = "indexer_loss"
INDEXER_METRIC = "indexer_kl"


@dataclass(frozen=True)
class DSASpec:
    """The resolved DeepSeek Sparse Attention of one model; see :class:`SparseLatentAttention`."""

    index_n_heads: int
    index_head_dim: int
    index_topk: int
    rope_interleave: bool = False
    phase: str = "sparse"
    indexer_loss_weight: float = 1.0

    def validate(self, rope_dim: int | None = None) -> DSASpec:
        for key in ("index_n_heads", "index_head_dim", "index_topk"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"architecture/dsa/{key} must be a positive integer, got {value!r}")
        if self.phase not in DSA_PHASES:
            raise ConfigError(f"architecture/dsa/phase={self.phase!r}: use one of {', '.join(DSA_PHASES)}")
        if not self.indexer_loss_weight >= 0:
            raise ConfigError(f"model/dsa/indexer_loss_weight must be 0 or positive, got {self.indexer_loss_weight}")
        if rope_dim is not None and rope_dim > self.index_head_dim:
            raise ConfigError(
                f"architecture/dsa/index_head_dim={self.index_head_dim} is narrower than the rotated part it "
                f"holds (architecture/mla/qk_rope_head_dim={rope_dim}); widen it"
            )
        return self

    def matmul_params(self, n_embd: int, query_width: int) -> int:
        """The indexer's projection weights: query (from the ``query_width`` low-rank query), key, weights."""
        h, d = self.index_n_heads, self.index_head_dim
        return query_width * h * d + n_embd * d + n_embd * h

    def flops(self, seq: int, n_embd: int, query_width: int) -> int:
        """Forward + backward FLOPs of one layer's indexer: projections and the ``[T, T]`` scores of each head."""
        return (
            6 * seq * self.matmul_params(n_embd, query_width) + 6 * seq * seq * self.index_n_heads * self.index_head_dim
        )


class DSAKeys(Module):
    """The ``architecture/dsa/*`` keys (and ``model/dsa/indexer_loss_weight``), shared by
    :class:`SparseLatentAttention` and the models that resolve them once (None: the preset's)."""

    index_n_heads: int | None = optional_key("architecture/dsa/index_n_heads", "heads of the lightning indexer")
    index_head_dim: int | None = optional_key("architecture/dsa/index_head_dim", "width of an indexer head and key")
    index_topk: int | None = optional_key(
        "architecture/dsa/index_topk", "keys each query attends to in sparse attention"
    )
    index_rope_interleave: bool | None = field(
        "architecture/dsa/rope_interleave",
        default=None,
        help="the indexer rotates interleaved pairs (GLM-5) rather than halves (DeepSeek-V3.2); None: the model's",
    )
    dsa_phase: str = field(
        "architecture/dsa/phase",
        default="sparse",
        choices=DSA_PHASES,
        help="dense_warmup: dense attention, the indexer trained toward it; sparse: top-k attention (the releases)",
    )
    indexer_loss_weight: float = field(
        "model/dsa/indexer_loss_weight",
        default=1.0,
        min=0.0,
        help="factor on the indexer's KL loss (per real query token, summed over layers) in the training loss",
    )

    def dsa_spec(self, rope_interleave: bool = False, **preset: int) -> DSASpec:
        """The keys as a validated :class:`DSASpec`; ``preset`` stands in for sizes left None and
        ``rope_interleave`` for ``architecture/dsa/rope_interleave`` left None."""
        values: dict[str, int] = {}
        for key in ("index_n_heads", "index_head_dim", "index_topk"):
            value = getattr(self, key)
            value = preset.get(key) if value is None else value
            if value is None:
                raise ConfigError(f"DeepSeek Sparse Attention needs architecture/dsa/{key}; set it")
            values[key] = value
        interleave = rope_interleave if self.index_rope_interleave is None else bool(self.index_rope_interleave)
        return DSASpec(
            **values,
            rope_interleave=interleave,
            phase=self.dsa_phase,
            indexer_loss_weight=float(self.indexer_loss_weight),
        ).validate()


class IndexerOutput(NamedTuple):
    """The indexer's float32 ``scores`` ``[B, T, S]``, the keys each query may see (``visible``, bool
    ``[B, T, S]``: causal, real, its own example) and the visible keys it keeps (``selected``)."""

    scores: jax.Array
    visible: jax.Array
    selected: jax.Array


def top_k_selection(scores: jax.Array, visible: jax.Array, k: int) -> jax.Array:
    """Bool ``[..., S]``: the ``k`` highest ``scores`` of each row among its ``visible`` keys (all of them
    where fewer are visible; ties go to the earlier key)."""
    steps = scores.shape[-1]
    if k >= steps:
        return visible
    masked = jnp.where(visible, scores, -jnp.inf)
    _, chosen = jax.lax.top_k(masked, k)
    picked = jnp.put_along_axis(jnp.zeros(scores.shape, jnp.bool_), chosen, True, axis=-1, inplace=False)
    return picked & visible


def indexer_loss(scores: jax.Array, attention: jax.Array, keys: jax.Array, rows: jax.Array) -> jax.Array:
    """The DeepSeek-V3.2 indexer loss ``sum_t KL(p[t] || softmax(I[t]))`` over the ``rows`` (bool
    ``[B, T]``) that count: ``p[t]`` is ``attention`` ``[B, T, S]`` (the main attention's probabilities
    summed over heads) restricted to ``keys`` (bool ``[B, T, S]``: every visible key in the dense warm-up,
    the selected ones in sparse training) and L1-normalised, and the softmax of the indexer ``scores`` is
    taken over the same keys. A float32 scalar."""
    f32 = jnp.float32
    target = jnp.where(keys, attention.astype(f32), 0.0)
    target = target / jnp.maximum(jnp.sum(target, axis=-1, keepdims=True), jnp.finfo(f32).tiny)
    log_q = jax.nn.log_softmax(jnp.where(keys, scores.astype(f32), jnp.finfo(f32).min), axis=-1)
    positive = keys & (target > 0)
    log_p = jnp.log(jnp.where(positive, target, 1.0))
    per_row = jnp.sum(jnp.where(positive, target * (log_p - log_q), 0.0), axis=-1)
    return jnp.sum(jnp.where(rows & jnp.any(keys, axis=-1), per_row, 0.0))


def real_queries(padding_mask: jax.Array | None, shape: tuple[int, int]) -> jax.Array:
    """Bool ``[B, T]``: the query positions that are real tokens."""
    if padding_mask is None:
        return jnp.ones(shape, jnp.bool_)
    mask = jnp.asarray(padding_mask)
    return mask > 0 if is_segment_ids(mask) else mask.astype(jnp.bool_)


class LightningIndexer(Module):
    """The lightning indexer of DeepSeek Sparse Attention and its top-k selection (module docstring).

    ``__call__(x, query_input, positions, padding_mask, decode)`` -> :class:`IndexerOutput`; ``x`` is
    the layer input ``[B, T, embed]``, ``query_input`` the latent attention's normalised low-rank query
    ``[B, T, q_lora_rank]``. Parameters: ``query`` ``[q_lora_rank, index_n_heads, index_head_dim]``,
    ``key`` ``[embed, index_head_dim]``, ``key_norm`` (LayerNorm ``scale`` and ``bias``), ``weights``
    ``[embed, index_n_heads]``. Built by :class:`SparseLatentAttention`, which passes every size."""

    n_heads: int = 1
    head_dim: int = 2
    topk: int = 1
    rope_dim: int = 0
    rope_interleave: bool = False
    position: PositionSpec = PositionSpec()
    init_std: float = INIT_STD

    @classmethod
    def components(cls) -> list[type]:
        return [LayerNorm]

    def _rotated(self, x: jax.Array, positions: jax.Array | None) -> jax.Array:
        """``x`` ``[B, T, N, head_dim]`` with its first ``rope_dim`` dimensions rotated."""
        if not self.rope_dim:
            return x
        part = x[..., : self.rope_dim]
        part = rotate(deinterleave(part) if self.rope_interleave else part, positions, *self._rope())
        return jnp.concatenate([part, x[..., self.rope_dim :]], axis=-1)

    def _rope(self) -> tuple[float, RopeScaling | None]:
        return self.position.theta, self.position.scaled

    @nn.compact
    def __call__(
        self,
        x: jax.Array,
        query_input: jax.Array,
        positions: jax.Array | None,
        padding_mask: jax.Array | None,
        decode: bool = False,
    ) -> IndexerOutput:
        dtype, std, f32 = self._activation_dtype, self.init_std, jnp.float32
        n_embd, h, d = x.shape[-1], self.n_heads, self.head_dim
        query = cast(param(self, "query", normal(std), (query_input.shape[-1], h, d), (None, None, None)), dtype)
        q = self._rotated(project("btr,rnh->btnh", query_input, query, dtype), positions)
        key = cast(param(self, "key", normal(std), (n_embd, d), (None, None)), dtype)
        norm = child(self, LayerNorm, eps=INDEXER_NORM_EPS, name="key_norm")
        k = self._rotated(norm(project("bte,ed->btd", x, key, dtype))[:, :, None, :], positions)[:, :, 0]
        weights = param(self, "weights", normal(std), (n_embd, h), (None, None))
        w = jnp.einsum("bte,en->btn", x.astype(f32), weights.astype(f32)) * h**-0.5

        cached = append_to_cache(self, {"key": k}, padding_mask, time_axis=1) if decode else None
        if cached is not None:
            keys, mask = cached
            visible = mask[:, 0]
        else:
            keys, steps = k, x.shape[1]
            causal = jnp.tril(jnp.ones((steps, steps), jnp.bool_))[None]
            allowed = attention_mask(padding_mask)
            visible = causal if allowed is None else causal & allowed[:, 0]
            visible = jnp.broadcast_to(visible, (x.shape[0], steps, steps))
        per_head = jnp.einsum("btnh,bsh->btns", q, keys.astype(q.dtype), preferred_element_type=f32)
        scores = jnp.einsum("btn,btns->bts", w, jax.nn.relu(per_head * d**-0.5))
        return IndexerOutput(scores, visible, top_k_selection(scores, visible, self.topk))


class SparseLatentAttention(DSAKeys, LatentAttention):
    """:class:`~theseus.model.layers.latent_attention.LatentAttention` with DeepSeek Sparse Attention:
    a :class:`LightningIndexer` (child ``indexer``) chooses each query's ``index_topk`` keys (module
    docstring). Config keys: LatentAttention's, ``architecture/dsa/*`` (``index_n_heads``,
    ``index_head_dim``, ``index_topk``, ``rope_interleave``, ``phase``) and
    ``model/dsa/indexer_loss_weight``. Needs the query bottleneck (``architecture/mla/q_lora_rank`` > 0):
    the indexer reads its normalised output."""

    @classmethod
    def components(cls) -> list[type]:
        return [*super().components(), LightningIndexer]

    @property
    def dsa(self) -> DSASpec:
        return self.dsa_spec().validate(self.spec.qk_rope_head_dim)

    def flops(self, seq: int, layer: int | None = None) -> int:
        """LatentAttention's FLOPs plus the indexer's (:meth:`DSASpec.flops`)."""
        n_embd = require(self.n_embd, "architecture/n_embd", "SparseLatentAttention")
        return super().flops(seq, layer) + self.dsa.flops(seq, n_embd, self.spec.q_lora_rank)

    def _indexer(self, spec: MLASpec, dsa: DSASpec) -> LightningIndexer:
        if not spec.q_lora_rank:
            raise ConfigError(
                "DeepSeek Sparse Attention reads the query bottleneck; set architecture/mla/q_lora_rank > 0"
            )
        return child(
            self,
            LightningIndexer,
            n_heads=dsa.index_n_heads,
            head_dim=dsa.index_head_dim,
            topk=dsa.index_topk,
            rope_dim=spec.qk_rope_head_dim,
            rope_interleave=dsa.rope_interleave,
            position=self.position,
            init_std=self.init_std,
            name="indexer",
        )

    def _attend(
        self,
        inputs: MLAInputs,
        padding_mask: jax.Array | None,
        positions: jax.Array | None,
        decode: bool,
        scale: float,
    ) -> jax.Array:
        spec, dsa, i = self.spec, self.dsa, inputs
        indexer = self._indexer(spec, dsa)
        cached = self._cached(i.latent, i.rope_key, padding_mask) if decode else None
        detached = jax.lax.stop_gradient
        index = indexer(detached(i.x), detached(i.query_input), positions, padding_mask, decode)
        sparse = dsa.phase == "sparse"
        if cached is not None:
            latents, rope_keys, mask = cached
            if sparse:
                mask = mask & index.selected[:, None]
            return self._absorbed(i.q, latents, rope_keys, i.key, i.value, mask, spec, scale)
        seen = index.visible & index.selected if sparse else index.visible
        k_nope = project("bsc,cnh->bsnh", i.latent, i.key, self._activation_dtype)
        heads = i.q.shape[2]
        k_rope = jnp.broadcast_to(i.rope_key[:, :, None, :], (*i.rope_key.shape[:2], heads, i.rope_key.shape[-1]))
        k = jnp.concatenate([k_nope, k_rope], axis=-1)
        v = project("bsc,cnh->bsnh", i.latent, i.value, self._activation_dtype)
        f32 = jnp.float32
        scores = jnp.einsum("btnh,bsnh->bnts", i.q, k, preferred_element_type=f32) * scale
        probs = jax.nn.softmax(jnp.where(seen[:, None], scores, jnp.finfo(f32).min), axis=-1)
        self._sow_indexer_loss(index, jax.lax.stop_gradient(jnp.sum(probs, axis=1)), seen, padding_mask, dsa)
        return jnp.einsum("bnts,bsnh->btnh", probs.astype(v.dtype), v)

    def _sow_indexer_loss(
        self,
        index: IndexerOutput,
        attention: jax.Array,
        keys: jax.Array,
        padding_mask: jax.Array | None,
        dsa: DSASpec,
    ) -> None:
        """Sow the indexer loss per real query (weighted, :data:`INDEXER_AUX_LOSS`) and its mean (metric)."""
        rows = real_queries(padding_mask, (attention.shape[0], attention.shape[1]))
        total = indexer_loss(index.scores, attention, keys, rows)
        mean = total / jnp.maximum(jnp.sum(rows & jnp.any(keys, axis=-1)), 1)
        add = operator.add
        self.sow(AUX_LOSSES, INDEXER_AUX_LOSS, dsa.indexer_loss_weight * mean, init_fn=lambda: 0.0, reduce_fn=add)
        self.sow(AUX_METRICS, INDEXER_METRIC, jax.lax.stop_gradient(mean), init_fn=lambda: 0.0, reduce_fn=add)


__all__ = [
    "DSA_PHASES",
    "INDEXER_AUX_LOSS",
    "INDEXER_METRIC",
    "DSAKeys",
    "DSASpec",
    "IndexerOutput",
    "LightningIndexer",
    "SparseLatentAttention",
    "indexer_loss",
    "real_queries",
    "top_k_selection",
]
