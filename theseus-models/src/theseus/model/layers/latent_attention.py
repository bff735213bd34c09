"""``LatentAttention``: multi-head latent attention (MLA, DeepSeek-V2/V3) with a compressed KV cache.

Queries come from the input directly (``q_lora_rank`` 0) or through a low-rank bottleneck
(``query_down`` to ``q_lora_rank``, RMSNorm, ``query``). Keys and values share one compressed latent:
``kv_down`` maps the input to ``kv_lora_rank`` dimensions, RMS-normalised (``kv_norm``), and the
per-head ``key`` (``qk_nope_head_dim``) and ``value`` (``v_head_dim``) are up-projections of it. The
position lives in a separate ``qk_rope_head_dim`` part: each head's query has its own rotated part,
the key's rotated part (``key_rope``) is one vector shared by all heads. A head's score is
``(q_nope . k_nope + q_rope . k_rope) * qk_head_dim ** -0.5`` (``qk_head_dim = nope + rope``).

``rope_interleave`` (DeepSeek's releases and transformers' default): the rotary part's dimensions pair
up as ``(0, 1), (2, 3), ...``; otherwise as the first and second halves (theseus' other layers). Both
rotate the same frequencies, so the layer gathers the even then the odd dimensions and rotates
half-split.

In KV-cache generation the cache holds the compressed latent, not per-head keys and values: per layer
``latent`` ``[B, L, kv_lora_rank]`` (after ``kv_norm``), ``rope_key`` ``[B, L, qk_rope_head_dim]`` (the
shared rotated key), ``mask`` ``[B, L]`` and ``index``; ``kv_lora_rank + qk_rope_head_dim`` values per
token (576 for DeepSeek-V3, against ``2 * 128 * 128`` = 32768 for its heads' keys and values). A
decode step attends in the latent space: the query's non-rotated part is mapped through ``key`` into
the latent (``q_nope @ key^T``), scored against the cached latents, and the weighted latents are
mapped through ``value`` (the same scores and outputs as expanding every cached key and value).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from theseus.base.axis import Axis, MeshAxis, ShardingPlan
from theseus.config import field
from theseus.errors import ConfigError
from theseus.model.layers import lora
from theseus.model.layers._common import (
    INIT_STD,
    architecture_field,
    cast,
    child,
    constrain,
    normal,
    optional_key,
    param,
    require,
)
from theseus.model.layers.attention import (
    ATTENTION_IMPLEMENTATIONS,
    append_to_cache,
    dot_product_attention,
    merged_heads,
)
from theseus.model.layers.context_parallel import refuse
from theseus.model.layers.layer_call import LayerCall, StackLayer
from theseus.model.layers.matmul import project
from theseus.model.layers.norms import RMSNorm
from theseus.model.layers.rotary import PositionSpec, RopeScaling, rotate, yarn_mscale
from theseus.model.module import Module

#: The latents' RMSNorm epsilon (transformers' DeepSeek-V3 fixes it, whatever ``rms_norm_eps`` is).
LATENT_NORM_EPS = 1e-6


@dataclass(frozen=True)
class MLASpec:
    """The resolved latent attention of one model (``DeepseekV3Architecture.mla``); see :class:`LatentAttention`."""

    q_lora_rank: int  # 0: the query is one projection of the input
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_interleave: bool = True
    mscale_all_dim: float = 0.0

    @property
    def qk_head_dim(self) -> int:
        """Width of one head's query and key: the non-rotated and the rotated part."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def validate(self) -> MLASpec:
        for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"architecture/mla/{key} must be a positive integer, got {value!r}")
        if not isinstance(self.q_lora_rank, int) or isinstance(self.q_lora_rank, bool) or self.q_lora_rank < 0:
            raise ConfigError(
                f"architecture/mla/q_lora_rank must be 0 (no query compression) or positive, got {self.q_lora_rank!r}"
            )
        if self.qk_rope_head_dim % 2:
            raise ConfigError(
                f"architecture/mla/qk_rope_head_dim={self.qk_rope_head_dim} must be even (rotary pairs); change it"
            )
        if not self.mscale_all_dim >= 0:
            raise ConfigError(f"architecture/mla/mscale_all_dim must be 0 or positive, got {self.mscale_all_dim}")
        return self

    def score_scale(self, scaling: RopeScaling | None) -> float:
        """What scores are multiplied by: ``qk_head_dim ** -0.5``, and with rope scaling on and
        ``mscale_all_dim`` set, ``yarn_mscale(factor, mscale_all_dim) ** 2`` (DeepSeek's long-context
        correction)."""
        scale = self.qk_head_dim**-0.5
        if scaling is not None and scaling.kind != "none" and self.mscale_all_dim:
            scale *= yarn_mscale(scaling.factor, self.mscale_all_dim) ** 2
        return scale

    def matmul_params(self, n_embd: int, n_heads: int) -> int:
        """Projection weights of one layer: query (or its two low-rank factors), the latent and shared
        rotated key, the key and value up-projections, the output."""
        if self.q_lora_rank:
            query = n_embd * self.q_lora_rank + self.q_lora_rank * n_heads * self.qk_head_dim
        else:
            query = n_embd * n_heads * self.qk_head_dim
        latent = n_embd * (self.kv_lora_rank + self.qk_rope_head_dim)
        up = self.kv_lora_rank * n_heads * (self.qk_nope_head_dim + self.v_head_dim)
        return query + latent + up + n_heads * self.v_head_dim * n_embd

    def score_flops(self, seq: int, n_heads: int) -> int:
        """Forward + backward FLOPs of one layer's scores and weighted values (the full square)."""
        return 6 * seq * seq * n_heads * (self.qk_head_dim + self.v_head_dim)


class MLAInputs(NamedTuple):
    """One call's projections, as :meth:`LatentAttention._attend` reads them: the layer input ``x``, the
    query input (:meth:`LatentAttention._query_input`), the rotated queries ``q`` ``[B, T, heads,
    qk_head_dim]``, the normalised ``latent`` ``[B, T, kv_lora_rank]``, the shared rotated key
    ``rope_key`` ``[B, T, qk_rope_head_dim]`` and the ``key`` / ``value`` up-projection kernels."""

    x: jax.Array
    query_input: jax.Array
    q: jax.Array
    latent: jax.Array
    rope_key: jax.Array
    key: jax.Array
    value: jax.Array


def deinterleave(x: jax.Array) -> jax.Array:
    """The even dimensions of the last axis, then the odd ones: interleaved rotary pairs as halves."""
    return jnp.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1)


class MLAKeys(Module):
    """The ``architecture/mla/*`` keys, shared by :class:`LatentAttention` and the models that resolve
    them once into ``DeepseekV3Architecture.mla`` (None: the preset's)."""

    q_lora_rank: int | None = field(
        "architecture/mla/q_lora_rank",
        default=None,
        help="rank of the query's low-rank bottleneck (0: one query projection; None: the preset's)",
    )
    kv_lora_rank: int | None = optional_key(
        "architecture/mla/kv_lora_rank", "width of the shared key/value latent", "preset"
    )
    qk_nope_head_dim: int | None = optional_key(
        "architecture/mla/qk_nope_head_dim", "per-head query/key width without rotary embedding"
    )
    qk_rope_head_dim: int | None = optional_key(
        "architecture/mla/qk_rope_head_dim", "per-head query and shared key width that is rotated"
    )
    v_head_dim: int | None = optional_key("architecture/mla/v_head_dim", "per-head value width")
    rope_interleave: bool = field(
        "architecture/mla/rope_interleave",
        default=True,
        help="rotary pairs are interleaved dimensions (DeepSeek's layout); false: first and second halves",
    )
    mscale_all_dim: float = field(
        "architecture/mla/mscale_all_dim",
        default=0.0,
        help="with rope scaling on, scores also scaled by (0.1 * mscale_all_dim * ln(rope_factor) + 1)^2 "
        "(DeepSeek's yarn releases: 1; 0: off)",
    )

    def mla_spec(self, **preset: int) -> MLASpec:
        """The keys as a validated :class:`MLASpec`; ``preset`` stands in for keys left None."""
        values: dict[str, int] = {}
        for key in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            value = getattr(self, key)
            value = preset.get(key) if value is None else value
            if value is None:
                raise ConfigError(f"multi-head latent attention needs architecture/mla/{key}; set it")
            values[key] = value
        return MLASpec(
            **values, rope_interleave=bool(self.rope_interleave), mscale_all_dim=float(self.mscale_all_dim)
        ).validate()


class LatentAttention(MLAKeys, lora.LoRAKeys, StackLayer):
    """Causal multi-head latent attention (see the module docstring), with padding masks and a
    compressed KV cache; the call is :class:`~theseus.model.layers.attention.CausalSelfAttention`'s.

    Config keys: ``architecture/mla/*`` (``q_lora_rank``, ``kv_lora_rank``, ``qk_nope_head_dim``,
    ``qk_rope_head_dim``, ``v_head_dim``, ``rope_interleave``, ``mscale_all_dim``), ``architecture/n_heads``,
    ``architecture/dropout`` (on the output, training only), ``architecture/attention_impl``, and the
    LoRA keys ``model/lora/*`` (:mod:`theseus.model.layers.lora`).

    LoRA targets (with transformers' / PEFT's module of each): ``query`` adapts the per-head query
    projection ``query`` (``q_b_proj``, or ``q_proj`` when ``q_lora_rank`` is 0); ``key`` and ``value``
    the up-projections ``key`` and ``value`` of the latent (together ``kv_b_proj``: each head's key rows,
    then its value rows); ``out`` the output ``out`` (``o_proj``). The down-projections ``query_down``
    (``q_a_proj``), ``kv_down`` and ``key_rope`` (``kv_a_proj_with_mqa``) stay frozen, as do the norms.
    The ``key`` / ``value`` adapters are folded into their kernels on each call (``kernel + (alpha / rank)
    A B``, :func:`~theseus.model.layers.lora.layer_delta`), so that decoding against the compressed cache
    reads the adapted kernels; no dropout can reach them, and ``model/lora/dropout`` > 0 with ``key`` or
    ``value`` targeted is refused.

    Parameters: ``query_down`` ``[embed, q_lora_rank]``, ``query_norm`` and ``query``
    ``[q_lora_rank, heads, qk_head_dim]`` (or ``query`` ``[embed, heads, qk_head_dim]`` when
    ``q_lora_rank`` is 0); ``kv_down`` ``[embed, kv_lora_rank]``, ``kv_norm``, ``key_rope``
    ``[embed, qk_rope_head_dim]``; ``key`` ``[kv_lora_rank, heads, qk_nope_head_dim]``, ``value``
    ``[kv_lora_rank, heads, v_head_dim]``; ``out`` ``[heads, v_head_dim, embed]``. Heads shard over the
    ``model`` mesh axis and the width over ``data``; the ranks are replicated.

    ``position`` (its ``theta`` and ``scaling``) rotates the rotary parts (passed by the model; a ``position`` of
    kind ``none`` leaves them unrotated: Kimi Linear's NoPE); scores are scaled by
    ``qk_head_dim ** -0.5`` (and by ``architecture/mla/mscale_all_dim``'s correction under rope scaling,
    :meth:`MLASpec.score_scale`).
    """

    n_embd: int | None = architecture_field("n_embd")
    n_heads: int | None = architecture_field("n_heads")
    dropout: float = architecture_field("dropout")
    attention_impl: str = architecture_field("attention_impl")
    position: PositionSpec = PositionSpec()
    init_std: float = INIT_STD
    out_std: float | None = None

    @classmethod
    def components(cls) -> list[type]:
        return [RMSNorm]

    @property
    def sharding(self) -> ShardingPlan:
        return ShardingPlan({Axis.EMBED: MeshAxis.DATA, Axis.HEADS: MeshAxis.MODEL})

    @property
    def spec(self) -> MLASpec:
        return self.mla_spec()

    def flops(self, seq: int, layer: int | None = None) -> int:
        """Forward + backward FLOPs of the projections and of the scores and weighted values (the full
        square: every layer attends to the whole sequence; ``layer`` is accepted as the other attention
        layers take it)."""
        n_embd = require(self.n_embd, "architecture/n_embd", "LatentAttention")
        n_heads = require(self.n_heads, "architecture/n_heads", "LatentAttention")
        spec = self.spec
        return 6 * seq * spec.matmul_params(n_embd, n_heads) + spec.score_flops(seq, n_heads)

    def _kernel(self, name: str, shape: tuple[int, ...], axes: tuple[str | None, ...], std: float) -> jax.Array:
        return cast(param(self, name, normal(std), shape, axes), self._activation_dtype)

    def _adapted(self, name: str) -> bool:
        """Whether the projection ``name`` (``query``, ``key``, ``value``, ``out``) carries a LoRA adapter."""
        return self.lora_rank > 0 and name in lora.check_targets(self.lora_targets)

    def _up_kernel(self, name: str, rank: int, n_heads: int, width: int) -> jax.Array:
        """The latent's up-projection ``name`` (``key`` or ``value``) ``[kv_lora_rank, heads, width]``, with
        its LoRA adapter folded in when it has one (:func:`~theseus.model.layers.lora.layer_delta`)."""
        axes = (None, Axis.HEADS, Axis.HEAD_DIM)
        kernel = self._kernel(name, (rank, n_heads, width), axes, self.init_std)
        if not self._adapted(name):
            return kernel
        if self.lora_dropout > 0.0:
            raise ConfigError(
                f"model/lora/dropout={self.lora_dropout} cannot reach the {name!r} adapter of multi-head latent "
                f"attention (it is folded into the kernel); set model/lora/dropout=0 or remove {name!r} from "
                "model/lora/targets"
            )
        return kernel + lora.layer_delta(self, name, (rank,), (n_heads, width), ((None,), axes[1:]))

    def _query_input(self, x: jax.Array, spec: MLASpec) -> jax.Array:
        """What the per-head query projection reads: the normalised low-rank query ``[B, T, q_lora_rank]``
        (``query_norm(x @ query_down)``), or ``x`` when ``q_lora_rank`` is 0."""
        if not spec.q_lora_rank:
            return x
        down = self._kernel("query_down", (x.shape[-1], spec.q_lora_rank), (Axis.EMBED, None), self.init_std)
        norm = child(self, RMSNorm, eps=LATENT_NORM_EPS, name="query_norm")
        return norm(project("bte,er->btr", x, down, self._activation_dtype))

    def _queries(self, x: jax.Array, spec: MLASpec, n_heads: int, deterministic: bool = True) -> jax.Array:
        """``[B, T, heads, qk_head_dim]`` of the query input ``x`` (:meth:`_query_input`), with the
        ``query`` LoRA adapter when it has one."""
        std = self.init_std
        axes = (None if spec.q_lora_rank else Axis.EMBED, Axis.HEADS, Axis.HEAD_DIM)
        kernel = self._kernel("query", (x.shape[-1], n_heads, spec.qk_head_dim), axes, std)
        q = project("btr,rnh->btnh", x, kernel, self._activation_dtype)
        if self._adapted("query"):
            dims = ((axes[0],), axes[1:])
            q = q + lora.layer_adapter(
                self, "query", x, (x.shape[-1],), (n_heads, spec.qk_head_dim), dims, deterministic
            )
        return constrain(q, (Axis.BATCH, Axis.SEQUENCE, Axis.HEADS, Axis.HEAD_DIM))

    def _rotate(self, x: jax.Array, positions: jax.Array | None, spec: MLASpec) -> jax.Array:
        """RoPE of ``[B, T, N, qk_rope_head_dim]`` (interleaved pairs gathered into halves first); unrotated
        where ``position`` is not rotary (Kimi Linear's NoPE: the part is still there, shared by the heads)."""
        if not self.position.rotary:
            return x
        return rotate(
            deinterleave(x) if spec.rope_interleave else x, positions, self.position.theta, self.position.scaled
        )

    def _cached(
        self, latent: jax.Array, rope_key: jax.Array, padding_mask: jax.Array | None
    ) -> tuple[jax.Array, ...] | None:
        """Append the step's latents and rotated keys to the cache (:func:`append_to_cache`, both held
        in the latents' dtype); (latents, rotated keys, mask ``[B, 1, T, L]``) over the whole cache, or
        None while the cache is being created."""
        entries = {"latent": latent, "rope_key": rope_key}
        return append_to_cache(self, entries, padding_mask, time_axis=1, dtype=latent.dtype)

    def _expanded(
        self,
        q: jax.Array,
        latent: jax.Array,
        rope_key: jax.Array,
        key: jax.Array,
        value: jax.Array,
        padding_mask: jax.Array | None,
        scale: float,
    ) -> jax.Array:
        """Causal attention over the whole sequence with every head's keys and values expanded from the
        latents; the narrower of the query/key and value widths is zero-padded so the shared kernels
        (blocked XLA, cuDNN) apply; ``[B, T, heads, v_head_dim]``."""
        heads = q.shape[2]
        k_nope = project("bsc,cnh->bsnh", latent, key, self._activation_dtype)
        k_rope = jnp.broadcast_to(rope_key[:, :, None, :], (*rope_key.shape[:2], heads, rope_key.shape[-1]))
        k = jnp.concatenate([k_nope, k_rope], axis=-1)
        v = project("bsc,cnh->bsnh", latent, value, self._activation_dtype)
        qk_dim, v_dim = q.shape[-1], v.shape[-1]
        width = max(qk_dim, v_dim)

        def pad(a: jax.Array) -> jax.Array:
            return a if a.shape[-1] == width else jnp.pad(a, ((0, 0), (0, 0), (0, 0), (0, width - a.shape[-1])))

        y = dot_product_attention(
            pad(q),
            pad(k),
            pad(v),
            mask=None,
            padding_mask=padding_mask,
            is_causal=True,
            implementation=self.attention_impl,
            scale=scale,
        )
        return y[..., :v_dim]

    @staticmethod
    def _absorbed(
        q: jax.Array,
        latent: jax.Array,
        rope_key: jax.Array,
        key: jax.Array,
        value: jax.Array,
        mask: jax.Array,
        spec: MLASpec,
        scale: float,
    ) -> jax.Array:
        """Attention against cached latents without expanding them per head: the non-rotated query is
        mapped into the latent space through ``key`` and the weighted latents out through ``value``."""
        q_nope, q_rope = q[..., : spec.qk_nope_head_dim], q[..., spec.qk_nope_head_dim :]
        q_latent = jnp.einsum("btnh,cnh->btnc", q_nope, key)
        f32 = jnp.float32
        scores = jnp.einsum("btnc,bsc->bnts", q_latent, latent, preferred_element_type=f32)
        scores = scores + jnp.einsum("btnr,bsr->bnts", q_rope, rope_key, preferred_element_type=f32)
        scores = jnp.where(mask, scores * scale, jnp.finfo(f32).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(latent.dtype)
        context = jnp.einsum("bnts,bsc->btnc", probs, latent)
        return jnp.einsum("btnc,cnh->btnh", context, value)

    def _attend(
        self,
        inputs: MLAInputs,
        padding_mask: jax.Array | None,
        positions: jax.Array | None,
        decode: bool,
        scale: float,
    ) -> jax.Array:
        """The heads' outputs ``[B, T, heads, v_head_dim]``: against the compressed cache when decoding
        (:meth:`_absorbed`), else over the sequence with every key and value expanded (:meth:`_expanded`).
        A subclass that changes which keys a query sees overrides this (DeepSeek Sparse Attention)."""
        spec, i = self.spec, inputs
        cached = self._cached(i.latent, i.rope_key, padding_mask) if decode else None
        if cached is not None:
            latents, rope_keys, mask = cached
            return self._absorbed(i.q, latents, rope_keys, i.key, i.value, mask, spec, scale)
        return self._expanded(i.q, i.latent, i.rope_key, i.key, i.value, padding_mask, scale)

    @nn.compact
    def forward(self, x: jax.Array, call: LayerCall, layer: int | jax.Array | None) -> jax.Array:
        padding_mask, positions, deterministic, decode = call
        refuse("multi-head latent attention (DeepSeek-V3)")
        if self.attention_impl not in ATTENTION_IMPLEMENTATIONS:
            raise ConfigError(
                f"unknown architecture/attention_impl {self.attention_impl!r}; "
                f"choose one of {', '.join(ATTENTION_IMPLEMENTATIONS)}"
            )
        n_embd = x.shape[-1]
        if self.n_embd is not None and self.n_embd != n_embd:
            raise ConfigError(f"attention input width {n_embd} does not match architecture/n_embd={self.n_embd}")
        n_heads = require(self.n_heads, "architecture/n_heads", "LatentAttention")
        spec, std, dtype = self.spec, self.init_std, self._activation_dtype
        x = cast(x, dtype)
        query_input = self._query_input(x, spec)
        q = self._queries(query_input, spec, n_heads, deterministic)
        down = self._kernel("kv_down", (n_embd, spec.kv_lora_rank), (Axis.EMBED, None), std)
        latent = child(self, RMSNorm, eps=LATENT_NORM_EPS, name="kv_norm")(project("bte,ec->btc", x, down, dtype))
        rope_kernel = self._kernel("key_rope", (n_embd, spec.qk_rope_head_dim), (Axis.EMBED, None), std)
        rope_key = self._rotate(project("bte,er->btr", x, rope_kernel, dtype)[:, :, None, :], positions, spec)[:, :, 0]
        nope = spec.qk_nope_head_dim
        q = jnp.concatenate([q[..., :nope], self._rotate(q[..., nope:], positions, spec)], axis=-1)
        key = self._up_kernel("key", spec.kv_lora_rank, n_heads, nope)
        value = self._up_kernel("value", spec.kv_lora_rank, n_heads, spec.v_head_dim)
        scale = spec.score_scale(self.position.scaled)
        y = self._attend(
            MLAInputs(x, query_input, q, latent, rope_key, key, value), padding_mask, positions, decode, scale
        )
        y = constrain(y, (Axis.BATCH, Axis.SEQUENCE, Axis.HEADS, Axis.HEAD_DIM))

        out_std = std if self.out_std is None else self.out_std
        out_axes = (Axis.HEADS, Axis.HEAD_DIM, Axis.EMBED)
        kernel = self._kernel("out", (n_heads, spec.v_head_dim, n_embd), out_axes, out_std)
        out = merged_heads(self, y, kernel, dtype, deterministic)
        if self.dropout > 0.0 and not deterministic:
            out = nn.Dropout(rate=self.dropout)(out, deterministic=False)
        return out


__all__ = ["LATENT_NORM_EPS", "LatentAttention", "MLAInputs", "MLAKeys", "MLASpec", "deinterleave"]
