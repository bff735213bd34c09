"""``Llama4``: Meta's Llama 4 text model: chunked local layers with RoPE and NoPE global layers, a
mixture of experts with one shared expert and a sigmoid of the top-k router logits scaling each expert's
*input*, and mixture layers interleaved with dense ones.

The mechanisms only this family has live here as subclasses of the shared layers:
:class:`Llama4Attention` (per layer, from ``architecture/layer_types``: the local
``chunked_attention`` layers rotate query and key pairs (the interleaved form, as Meta's complex
rotation), L2-normalise them without weights and attend within ``architecture/attention_chunk_size``
tokens; the global ``full_attention`` layers have no RoPE and scale their queries by the attention
temperature), :class:`Llama4MoE` and :class:`Llama4Block`, which builds the two.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from theseus.config import field
from theseus.errors import ConfigError
from theseus.model.layers._common import optional_key
from theseus.model.layers.attention import (
    CHUNKED_ATTENTION,
    FULL_ATTENTION,
    NO_WINDOW,
    CausalSelfAttention,
    append_to_cache,
    attention_backend,
    cached_attention,
    dot_product_attention,
    heads_major,
    is_segment_ids,
)
from theseus.model.layers.context_parallel import refuse
from theseus.model.layers.experts import Kernels, Routing
from theseus.model.layers.moe import MoE, MoESpec
from theseus.model.layers.rotary import RopeScaling, head_angles, magnified, rope_layer_flags
from theseus.model.models.llama.model import Llama
from theseus.model.stack.architecture import Architecture, Preset, lookup_preset
from theseus.model.stack.mixture import MixtureLM, MoEBlock, MoEPreset
from theseus.model.stack.transformer import token_positions


@dataclass(frozen=True)
class Llama4Preset(MoEPreset):
    """A :class:`MoEPreset` with Llama 4's layer layout: every ``interleave_moe_layer_step``-th layer a
    mixture (the others dense, of ``d_ff``), one shared expert and the sigmoid router."""

    interleave_moe_layer_step: int = 1
    n_shared: int = 1
    router: str = "sigmoid"


LLAMA4_PRESETS: dict[str, Preset] = {
    "tiny": Llama4Preset(
        n_layers=4,
        n_heads=4,
        n_kv_heads=2,
        n_embd=64,
        head_dim=16,
        mlp_ratio=2.0,
        n_experts=4,
        top_k=1,
        expert_hidden=32,
        interleave_moe_layer_step=2,
        description="4 layers (mixtures of 4 experts of 32, top 1, at 1 and 3), 64 wide; tests and demos",
    ),
    # meta-llama/Llama-4-Scout-17B-16E's text config: 48 layers, every one a mixture of 16 experts of
    # intermediate 8192 (top 1) and a shared expert, 40 query and 8 key/value heads of 128, 5120 wide,
    # every 4th layer NoPE; 107.8B parameters (17.2B active) at vocab 202048 unpadded (transformers'
    # count of the text model; the 109B of the release includes the vision encoder).
    "llama4-scout": Llama4Preset(
        n_layers=48,
        n_heads=40,
        n_kv_heads=8,
        n_embd=5120,
        head_dim=128,
        mlp_ratio=16384 / 5120,
        n_experts=16,
        top_k=1,
        expert_hidden=8192,
        interleave_moe_layer_step=1,
        description="Llama 4 Scout's text model: 107.8B parameters (17.2B active) at vocab 202048",
    ),
}


@dataclass(frozen=True)
class Llama4Architecture(Architecture):
    """An :class:`Architecture` whose mixture is only at ``mixture_layers`` (the others dense, of
    ``d_ff``); the active parameters and the loss weight count them."""

    mixture_layers: tuple[int, ...] = ()

    @property
    def moe_layers(self) -> int:
        return 0 if self.moe is None else len(self.mixture_layers)

    @property
    def dense_layers(self) -> int:
        return self.n_layers - self.moe_layers


def mixture_layers(arch: Architecture) -> tuple[int, ...]:
    """The layers of ``arch`` whose feed-forward is the mixture (every one but Llama 4's dense layers)."""
    if isinstance(arch, Llama4Architecture):
        return arch.mixture_layers
    first = 0 if arch.moe is None else arch.moe.first_k_dense
    return tuple(range(first, arch.n_layers)) if arch.moe is not None else ()


#: The layers without RoPE when ``architecture/no_rope_layers`` is None: every this many, the last of each.
NOPE_EVERY = 4


def rotate_pairs(
    x: jax.Array, positions: jax.Array | None, theta: float, scaling: RopeScaling | None = None
) -> jax.Array:
    """RoPE of ``x`` ``[B, T, N, H]`` with adjacent elements ``(2i, 2i + 1)`` as the (real, imaginary)
    pairs (Meta's complex form; theseus' :func:`~theseus.model.layers.rotary.rotate` pairs the halves),
    in float32, returned in ``x``'s dtype."""
    angles = head_angles(x, positions, theta, scaling)
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    pairs = x.astype(jnp.float32).reshape(*x.shape[:-1], x.shape[-1] // 2, 2)
    real, imag = pairs[..., 0], pairs[..., 1]
    rotated = jnp.stack([real * cos - imag * sin, imag * cos + real * sin], axis=-1).reshape(x.shape)
    return magnified(rotated, scaling, x)


def l2_norm(x: jax.Array, eps: float) -> jax.Array:
    """``x / sqrt(mean(x^2) + eps)`` over the last axis, no weights (float32 inside)."""
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)).astype(x.dtype)


class Llama4Attention(CausalSelfAttention):
    """:class:`CausalSelfAttention` with Llama 4's two kinds of layer (``layer_types``):

    * ``chunked_attention`` (local): queries and keys rotated in adjacent pairs (:func:`rotate_pairs`),
      then (``architecture/qk_l2_norm``) each head L2-normalised without weights (eps
      ``architecture/norm_eps``); a token attends only to the tokens of its own chunk of
      ``architecture/attention_chunk_size`` positions (None: no chunks), in training and against the KV
      cache (which keeps each key's position);
    * ``full_attention`` (global): no RoPE; with ``architecture/attn_temperature_tuning`` the query at
      sequence index ``i`` is scaled by ``log(floor((i + 1) / floor_scale) + 1) * attn_scale + 1``.

    Positions are theseus' (real tokens before, :func:`token_positions`), so a left-padded row's chunks
    start at its first real token (the splash kernel on TPUs counts chunks from a row's first slot: a
    training or evaluation row holds its real tokens first, and decoding attends through the KV cache,
    which keeps positions); the temperature reads the sequence index (padding included), as
    transformers does. The window given to :meth:`_attend` is the layer's chunk (:data:`NO_WINDOW`
    without chunks) on local layers and 0 on global ones.
    """

    attention_chunk_size: int | None = field(
        "architecture/attention_chunk_size",
        default=8192,
        help="Llama 4: tokens of the local (RoPE) layers attend within chunks of this many positions (None: whole)",
    )
    qk_l2_norm: bool = field(
        "architecture/qk_l2_norm",
        default=True,
        help="Llama 4: L2-normalise each query and key head (no weights) after RoPE on the local layers",
    )
    attn_temperature_tuning: bool = field(
        "architecture/attn_temperature_tuning",
        default=True,
        help="Llama 4: scale the global (NoPE) layers' queries by log(floor((i+1)/floor_scale)+1)*attn_scale+1",
    )
    attn_floor_scale: float = field(
        "architecture/attn_floor_scale", default=8192.0, above=0.0, help="Llama 4: the temperature's floor_scale"
    )
    attn_scale: float = field("architecture/attn_scale", default=0.1, help="Llama 4: the temperature's attn_scale")

    def _local(self, layer: int | jax.Array | None) -> bool | jax.Array:
        """Whether ``layer`` is a local (chunked, RoPE) layer: a Python bool, or traced for a traced index."""
        types = self.layer_types
        if types is None:
            return True
        if layer is None:
            raise ConfigError("Llama 4's attention needs its layer index (layer=...)")
        if isinstance(layer, int):
            return types[layer] == CHUNKED_ATTENTION
        return jnp.asarray([t == CHUNKED_ATTENTION for t in types])[layer]

    def _layer_window(self, layer: int | jax.Array | None) -> int | jax.Array | None:
        chunk = NO_WINDOW if self.attention_chunk_size is None else int(self.attention_chunk_size)
        local = self._local(layer)
        if isinstance(local, bool):
            return chunk if local else 0
        return jnp.where(local, chunk, 0)

    def attended(self, seq: int, layer: int | None = None) -> int:
        """Keys each query is counted against: its chunk on a local layer (when shorter than ``seq``),
        ``seq`` on a global one (and for every layer without ``layer``, as the base class counts)."""
        if self.attention_chunk_size is None or (self.layer_types is not None and layer is None):
            return seq
        return min(seq, int(self.attention_chunk_size)) if self._local(layer) is True else seq

    def _rotate(
        self, q: jax.Array, k: jax.Array, positions: jax.Array | None, layer: int | jax.Array | None
    ) -> tuple[jax.Array, jax.Array]:
        local = self._local(layer)
        if local is False:
            return q, k
        rotated = []
        for x in (q, k):
            x = rotate_pairs(x, positions, self.position_spec.theta, self.position_spec.scaled)
            rotated.append(l2_norm(x, self.attention_spec.norm_eps) if self.qk_l2_norm else x)
        if local is True:
            return rotated[0], rotated[1]
        return jnp.where(local, rotated[0], q), jnp.where(local, rotated[1], k)

    def _attend(
        self,
        q: jax.Array,
        k: jax.Array,
        v: jax.Array,
        padding_mask: jax.Array | None,
        window: int | jax.Array | None,
        decode: bool,
        selection: jax.Array | None = None,
    ) -> jax.Array:
        del selection  # None: Llama 4's attention has no indexer (CausalSelfAttention._selection)
        refuse("Llama 4's chunked and temperature-tuned attention")
        batch, steps = q.shape[:2]
        step_mask = jnp.ones((batch, steps), jnp.bool_) if padding_mask is None else padding_mask
        cache = decode and self.has_variable("cache", "index")
        start: Any = self.get_variable("cache", "index") if cache else 0
        if cache:  # the step's positions continue the real tokens the cache holds (as the model counts them)
            seen = jnp.sum(self.get_variable("cache", "mask"), axis=1, dtype=jnp.int32)
            positions = token_positions(step_mask, seen)
        elif padding_mask is not None:
            positions = token_positions(padding_mask)
        else:
            positions = jnp.broadcast_to(jnp.arange(steps, dtype=jnp.int32), (batch, steps))
        is_global = window == 0
        if self.attn_temperature_tuning and is_global is not False:
            index = (start + jnp.arange(steps)).astype(jnp.float32)
            scales = jnp.log1p(jnp.floor((index + 1.0) / self.attn_floor_scale)) * self.attn_scale + 1.0
            tuned = (q.astype(jnp.float32) * scales[None, :, None, None]).astype(q.dtype)
            q = tuned if is_global is True else jnp.where(is_global, tuned, q)

        def same_chunk(key_positions: jax.Array) -> jax.Array | None:
            """``[B, 1, T, S]``: the query and the key are in one chunk (None: no chunks bind)."""
            if is_global is True or window is None:
                return None
            chunk = jnp.maximum(jnp.asarray(window), 1)
            same = (positions[:, :, None] // chunk) == (key_positions[:, None, :] // chunk)
            return (same | is_global)[:, None]

        if decode:
            entries = {"key": heads_major(k), "value": heads_major(v), "position": positions[:, None, :, None]}
            cached = append_to_cache(self, entries, padding_mask, time_axis=2)
            if cached is not None:
                keys, values, key_positions, visible = cached
                chunks = same_chunk(key_positions[:, 0, :, 0])
                visible = visible if chunks is None else visible & chunks
                return cached_attention(
                    q, keys, values, visible, scale=self._scale(), softcap=self.attention_spec.softcap
                )
        # the kernel counts chunks from each row's first slot: a training row holds its real tokens first
        packed = padding_mask is not None and is_segment_ids(padding_mask)
        kernel = attention_backend(self.attention_spec.implementation, q, v) == "splash"
        chunk = window if kernel and isinstance(window, int) and 0 < window < NO_WINDOW and not packed else None
        return dot_product_attention(
            q,
            k,
            v,
            mask=None if chunk is not None else same_chunk(positions),
            padding_mask=padding_mask,
            chunk=chunk,
            is_causal=True,
            implementation=self.attention_spec.implementation,
            scale=self._scale(),
            softcap=self.attention_spec.softcap,
        )


class Llama4MoE(MoE):
    """:class:`MoE` with Llama 4's routing: each token's ``top_k`` experts are its largest router
    logits and their sigmoids scale the token *going into* each expert (the expert's output is summed
    unweighted: ``sum_j expert_j(sigmoid(l_j) * x)``); plus ``n_shared`` shared experts. No balancing
    bias; the load-balancing loss reads the normalised sigmoids."""

    def _route(self, logits: jax.Array, spec: MoESpec) -> tuple[Routing, jax.Array | None]:
        top, experts = jax.lax.top_k(logits, spec.top_k)
        scores = jax.nn.sigmoid(logits)
        probs = scores / jnp.sum(scores, axis=-1, keepdims=True)
        return Routing(jax.nn.sigmoid(top), experts.astype(jnp.int32), probs), None

    def _experts(
        self, tokens: jax.Array, routing: Routing, kernels: Kernels, act: Any, spec: MoESpec
    ) -> tuple[jax.Array, jax.Array | None]:
        n, k = routing.experts.shape
        scaled = tokens[:, None, :] * routing.weights[..., None].astype(tokens.dtype)  # [N, k, D]
        single = Routing(jnp.ones((n * k, 1), jnp.float32), routing.experts.reshape(n * k, 1), routing.probs)
        one = dataclasses.replace(spec, top_k=1)
        out, kept = super()._experts(scaled.reshape(n * k, -1), single, kernels, act, one)
        return out.reshape(n, k, -1).sum(axis=1), None if kept is None else kept.reshape(n, k)


class Llama4Block(MoEBlock):
    """:class:`MoEBlock` of :class:`Llama4Attention` and :class:`Llama4MoE` (a dense MLP when ``dense``)."""

    ATTENTION: ClassVar[type[CausalSelfAttention]] = Llama4Attention
    MOE: ClassVar[type[MoE]] = Llama4MoE


class Llama4(MixtureLM, Llama):
    """Llama 4's text model: :class:`Llama`'s pre-norm blocks (RMSNorm, grouped-query attention, SwiGLU,
    untied head) with :class:`Llama4Attention` (local chunked RoPE layers with the query/key L2 norm;
    every ``architecture/no_rope_layers`` 0 a global NoPE layer with the attention temperature) and
    mixture layers (:class:`Llama4MoE`: sigmoid of the top-k logits on the experts' inputs, one shared
    expert of ``architecture/moe/expert_hidden``) at ``architecture/moe/moe_layers`` (None: every
    ``architecture/moe/interleave_moe_layer_step``-th layer, the last of each step); the other layers
    have a dense SwiGLU MLP of ``architecture/d_ff`` (transformers' ``intermediate_size_mlp``).

    ``architecture.layer_types`` holds ``chunked_attention`` for the RoPE layers and ``full_attention``
    for the NoPE ones; the architecture is a :class:`Llama4Architecture` whose ``mixture_layers`` the
    FLOP and active-parameter counts read. A scanned model runs one
    period of the RoPE/NoPE pattern and of the dense/mixture interleave per scan step, each position a
    layer of its own (dense and mixture layers differ in shape).

    Presets (``architecture/preset``): ``tiny`` (4 layers, mixtures at 1 and 3) and ``llama4-scout``
    (the published text model: 107.8B parameters, 17.2B active, at ``architecture/vocab_size=202048``;
    the releases use ``architecture/rope_theta=500000`` with ``llama3`` scaling, factor 16 over 8192
    positions, which ``hf/import`` reads from ``config.json``). ``hf/import`` of a ``model_type:
    llama4_text`` checkpoint builds this model.
    """

    PRESETS: ClassVar[dict[str, Preset]] = LLAMA4_PRESETS
    FAMILY: ClassVar[str] = "Llama4"
    BLOCK = Llama4Block

    no_rope_layers: tuple[int, ...] | None = optional_key(
        "architecture/no_rope_layers",
        "Llama 4: per layer 1 (RoPE, chunked, local) or 0 (NoPE, global)",
        "every 4th layer 0",
    )
    moe_layers: tuple[int, ...] | None = optional_key(
        "architecture/moe/moe_layers",
        "Llama 4: the layers whose feed-forward is the mixture",
        "from interleave_moe_layer_step",
    )
    interleave_moe_layer_step: int | None = optional_key(
        "architecture/moe/interleave_moe_layer_step",
        "Llama 4: every this many layers one is a mixture, the last of each step",
    )

    def _n_layers(self) -> int:
        preset = lookup_preset(self.PRESETS, self.preset, self.FAMILY)
        return preset.n_layers if self.n_layers is None else self.n_layers

    def rope_layers(self) -> tuple[bool, ...]:
        """Per layer: whether it is a local RoPE layer (``no_rope_layers``, default every 4th one NoPE)."""
        return rope_layer_flags(self.no_rope_layers, self._n_layers(), NOPE_EVERY)

    def mixture_layers(self) -> tuple[int, ...]:
        """The layers whose feed-forward is the mixture, in order."""
        n_layers = self._n_layers()
        if self.moe_layers is not None:
            layers = sorted(set(self.moe_layers))
            if not layers or layers[0] < 0 or layers[-1] >= n_layers:
                raise ConfigError(
                    f"architecture/moe/moe_layers={list(self.moe_layers)} must name layers in 0..{n_layers - 1}"
                )
            return tuple(layers)
        step = self.interleave_moe_layer_step
        if step is None:
            preset = lookup_preset(self.PRESETS, self.preset, self.FAMILY)
            step = preset.interleave_moe_layer_step if isinstance(preset, Llama4Preset) else 1
        if step < 1 or step > n_layers:
            raise ConfigError(f"architecture/moe/interleave_moe_layer_step={step} must be in 1..{n_layers}")
        return tuple(range(step - 1, n_layers, step))

    def _extra_architecture(self) -> dict[str, Any]:
        types = tuple(CHUNKED_ATTENTION if rope else FULL_ATTENTION for rope in self.rope_layers())
        return {**super()._extra_architecture(), "layer_types": types}

    def resolve_architecture(self) -> Architecture:
        arch = super().resolve_architecture()
        if self.first_k_dense:
            raise ConfigError(
                f"architecture/moe/first_k_dense={self.first_k_dense}: Llama 4's dense layers are set by "
                "architecture/moe/moe_layers or interleave_moe_layer_step; remove it"
            )
        values = {f.name: getattr(arch, f.name) for f in dataclasses.fields(arch)}
        return Llama4Architecture(**values, mixture_layers=self.mixture_layers()).validate()

    def _layer_options(self, layer: int) -> dict[str, Any]:
        return {"dense": layer not in self.mixture_layers()}


__all__ = [
    "LLAMA4_PRESETS",
    "Llama4",
    "Llama4Architecture",
    "Llama4Attention",
    "Llama4Block",
    "Llama4MoE",
    "Llama4Preset",
    "l2_norm",
    "mixture_layers",
    "rotate_pairs",
]
