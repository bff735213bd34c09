"""``Qwen3Next``: Qwen3-Next (Qwen3-Next-80B-A3B): Gated DeltaNet linear-attention layers interleaved
with gated full-attention layers, zero-centred RMSNorms and a mixture of experts with a gated shared
expert.

The mechanisms only this family has live here (its Gated DeltaNet is the shared :mod:`theseus.model.layers.deltanet`):
:class:`Qwen3NextAttention` (the full-attention layers: an output gate, ``sigmoid`` of a projection of the
input, on each head's output; partial RoPE), :class:`Qwen3NextMoE` (the shared expert scaled by
``sigmoid(x . shared_gate)``) and :class:`HybridBlock`, which builds a
:class:`~theseus.model.layers.deltanet.GatedDeltaNet` on the ``linear_attention`` layers.
:class:`Qwen3NextHybrid` is these layers with dense feed-forwards (the dense Qwen3.5 builds on it),
:class:`Qwen3Next` adds the mixture (:class:`Qwen3NextBlock`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from theseus.base.axis import Axis
from theseus.config import field
from theseus.errors import ConfigError
from theseus.model.layers._common import GATED, cast, child, normal, optional_key, param
from theseus.model.layers.attention import (
    FULL_ATTENTION,
    LINEAR_ATTENTION,
    CausalSelfAttention,
    PartialRotaryAttention,
    rotary_fraction_field,
)
from theseus.model.layers.deltanet import CHUNK, GatedDeltaNet
from theseus.model.layers.mlp import MLP
from theseus.model.layers.moe import MoE
from theseus.model.models.qwen3.model import Qwen3
from theseus.model.module import Module
from theseus.model.stack.architecture import (
    Architecture,
    Preset,
    architecture_as,
    extend_architecture,
    lookup_preset_as,
    preset_or,
)
from theseus.model.stack.block import Block
from theseus.model.stack.mixture import MixtureLM, MoEBlock, MoEPreset
from theseus.model.stack.transformer import TransformerLM


@dataclass(frozen=True, kw_only=True)
class DeltaNetShape:
    """The Gated DeltaNet's shape (Qwen3-Next's by default): what a hybrid preset gives, its architecture
    keeps and the ``architecture/linear_*`` keys of the same names override (:class:`LinearAttentionLM`)."""

    linear_key_heads: int = 16
    linear_value_heads: int = 32
    linear_key_dim: int = 128
    linear_value_dim: int = 128
    conv_kernel: int = 4


@dataclass(frozen=True)
class HybridPreset(Preset, DeltaNetShape):
    """A :class:`Preset` with the Gated DeltaNet's shape and every ``full_attention_interval``-th layer
    full attention (the others linear): the layers of :class:`Qwen3NextHybrid`."""

    full_attention_interval: int = 4


@dataclass(frozen=True)
class Qwen3NextPreset(MoEPreset, HybridPreset):
    """A :class:`MoEPreset` with Qwen3-Next's linear-attention shape (:class:`HybridPreset`) and its
    gated shared expert (of ``shared_expert_hidden``; None: ``expert_hidden``)."""

    shared_expert_hidden: int | None = None


QWEN3_NEXT_PRESETS: dict[str, Preset] = {
    "tiny": Qwen3NextPreset(
        n_layers=4,
        n_heads=4,
        n_kv_heads=2,
        n_embd=64,
        head_dim=16,
        mlp_ratio=2.0,
        n_experts=4,
        expert_hidden=32,
        linear_key_heads=2,
        linear_value_heads=4,
        linear_key_dim=16,
        linear_value_dim=16,
        description="4 layers (full attention at 3), mixtures of 4 experts of 32 (top 2) + a shared one, 64 wide",
    ),
    # Qwen/Qwen3-Next-80B-A3B-Instruct's config.json: 48 layers (every 4th full attention: 16 query and
    # 2 key/value heads of 256, a quarter of each rotated; the others Gated DeltaNet: 16 query/key heads
    # and 32 value heads of 128, convolution of 4), 2048 wide, every layer a mixture of 512 experts of
    # 512 (top 10) with a gated shared expert of 512, untied head; 79.7B parameters (3.9B active, 3.3B
    # without the embedding and the head) at vocab 151936 (transformers' count on the meta device).
    "qwen3-next-80b-a3b": Qwen3NextPreset(
        n_layers=48,
        n_heads=16,
        n_kv_heads=2,
        n_embd=2048,
        head_dim=256,
        mlp_ratio=5120 / 2048,
        n_experts=512,
        top_k=10,
        expert_hidden=512,
        description="Qwen3-Next-80B-A3B's shape: 79.7B parameters (3.9B active) at vocab 151936",
    ),
}


@dataclass(frozen=True)
class Qwen3NextArchitecture(Architecture, DeltaNetShape):
    """An :class:`Architecture` with the Gated DeltaNet's shape (the ``linear_attention`` layers of
    ``layer_types``) and the gated shared expert's width, which its blocks build their layers with."""

    linear_chunk: int = CHUNK
    shared_expert_hidden: int = 0

    @property
    def linear_layers(self) -> int:
        return sum(t == LINEAR_ATTENTION for t in self.layer_types or ())


class Qwen3NextAttention(PartialRotaryAttention):
    """:class:`CausalSelfAttention` of Qwen3-Next's full-attention layers: ``gate`` (``[embed, heads,
    head_dim]``, a second query-shaped projection) gives each head's output a factor ``sigmoid(gate)``
    before the output projection; RoPE turns only the first ``architecture/partial_rotary_factor`` of
    each head (the rest passes; :class:`PartialRotaryAttention`), after the zero-centred query/key norms."""

    partial_rotary_factor: float = rotary_fraction_field(0.25)

    def _layer_window(self, layer: int | jax.Array | None) -> int | jax.Array | None:
        return self.attention_spec.sliding_window

    def matmul_params(self) -> int:
        """The query, key, value and output projections and the output gate (query-shaped)."""
        n_embd = self._width()
        n_heads, _, head_dim = self._heads(n_embd)
        return super().matmul_params() + n_embd * n_heads * head_dim

    def _gate_output(self, x: jax.Array, y: jax.Array, n_heads: int, head_dim: int, deterministic: bool) -> jax.Array:
        gate = self._project(x, "gate", n_heads, head_dim, Axis.HEADS, deterministic)
        return (y.astype(jnp.float32) * jax.nn.sigmoid(gate.astype(jnp.float32))).astype(y.dtype)


class Qwen3NextMoE(MoE):
    """:class:`MoE` (softmax top-k routing, ``norm_topk_prob``) plus Qwen3-Next's shared expert: a
    SwiGLU MLP ``shared`` of ``shared_hidden`` whose output is scaled per token by
    ``sigmoid(x . shared_gate)`` (``shared_gate`` ``[embed]``). The mixture's own ``n_shared`` is 0."""

    shared_hidden: int = 0

    def active_matmul_params(self) -> int:
        """The mixture's active weights plus the gated shared expert (its MLP and ``shared_gate``)."""
        shared = 0
        if self.shared_hidden > 0:
            gated = self.resolved_activation in GATED
            shared = ((3 if gated else 2) * self.shared_hidden + 1) * self._width()
        return super().active_matmul_params() + shared

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool = False) -> jax.Array:
        out = super().__call__(x, deterministic)
        if self.shared_hidden <= 0:
            return out
        shared = child(
            self,
            MLP,
            n_embd=x.shape[-1],
            d_ff=self.shared_hidden,
            activation=self.resolved_activation,
            use_bias=False,
            lora_rank=0,
            init_std=self.init_std,
            out_std=self.out_std,
            name="shared",
        )
        weight = param(self, "shared_gate", normal(self.init_std), (x.shape[-1],), (Axis.EMBED,))
        dtype = self._activation_dtype
        scale = jax.nn.sigmoid(jnp.einsum("bte,e->bt", x.astype(jnp.float32), weight.astype(jnp.float32)))
        return out + (shared(x, deterministic) * cast(scale[..., None], dtype)).astype(dtype)


class HybridBlock(Block):
    """:class:`Block` of Qwen3-Next's layers with a dense MLP: its ``attn`` is a :class:`GatedDeltaNet`
    when ``linear``, else :class:`Qwen3NextAttention` (the block of :class:`Qwen3NextHybrid`). A family
    with these layers sets the architecture its linear layers read (``LINEAR_ARCHITECTURE``, its class
    named in ``LINEAR_NEEDS``' refusal) and the Gated DeltaNet's own options (:meth:`linear_options`)."""

    ATTENTION: ClassVar[type[CausalSelfAttention]] = Qwen3NextAttention

    MIXERS: ClassVar[tuple[type, ...]] = (GatedDeltaNet,)
    LINEAR_ARCHITECTURE: ClassVar[type[Qwen3NextArchitecture]] = Qwen3NextArchitecture
    LINEAR_NEEDS: ClassVar[str] = "Qwen3-Next's linear-attention layers need a Qwen3NextArchitecture (model/qwen3_next)"

    linear: bool = False

    def attention(self) -> Module:
        if not self.linear:
            return super().attention()
        arch = architecture_as(self.arch, self.LINEAR_ARCHITECTURE, self.LINEAR_NEEDS)
        layer: GatedDeltaNet = child(
            self,
            GatedDeltaNet,
            key_heads=arch.linear_key_heads,
            value_heads=arch.linear_value_heads,
            key_dim=arch.linear_key_dim,
            value_dim=arch.linear_value_dim,
            conv_kernel=arch.conv_kernel,
            chunk_size=arch.linear_chunk,
            out_std=self.out_std,
            n_embd=arch.n_embd,
            **self.linear_options(),
        )
        return layer

    def linear_options(self) -> dict[str, Any]:
        """Fields of the :class:`GatedDeltaNet` beyond its shape, which ``attention()`` sets from the
        architecture: its gated output norm's epsilon, the model's here (OLMo Hybrid's own epsilon and write
        strength, Qwen4-Exp's output gate activation)."""
        return {"norm_eps": self.arch.norm.eps}


class Qwen3NextBlock(HybridBlock, MoEBlock):
    """:class:`MoEBlock` of Qwen3-Next: its ``attn`` as :class:`HybridBlock`'s; its mixture
    :class:`Qwen3NextMoE` (a dense MLP when ``dense``)."""

    MOE: ClassVar[type[MoE]] = Qwen3NextMoE

    def moe_options(self) -> dict[str, Any]:
        """The gated shared expert's width (:class:`Qwen3NextMoE`)."""
        arch = self.arch
        return {"shared_hidden": arch.shared_expert_hidden if isinstance(arch, Qwen3NextArchitecture) else 0}


class LinearAttentionLM(TransformerLM):
    """A :class:`TransformerLM` whose ``architecture/layer_types`` are ``linear_attention`` (a
    :class:`GatedDeltaNet` of the ``architecture/linear_*`` keys, each None key the :class:`HybridPreset`'s)
    and ``full_attention`` layers, by default every ``architecture/full_attention_interval``-th layer full
    (:meth:`default_layer_types`): the keys and the resolution Qwen3-Next's and OLMo Hybrid's layers share.
    Its blocks are :class:`HybridBlock` s (``linear`` per layer); its architecture is the one their linear
    layers read (``HybridBlock.LINEAR_ARCHITECTURE``) with :meth:`linear_extras`."""

    #: The family's name where ``layer_types`` are refused.
    LINEAR_FAMILY: ClassVar[str] = "Qwen3-Next"

    layer_types: tuple[str, ...] | None = optional_key(
        "architecture/layer_types",
        "linear_attention | full_attention per layer",
        "every full_attention_interval-th layer full",
    )
    full_attention_interval: int | None = optional_key(
        "architecture/full_attention_interval",
        "every this many layers one is full attention, the last of each",
    )
    linear_key_heads: int | None = field(
        "architecture/linear_num_key_heads", default=None, help="query/key heads of the linear layers"
    )
    linear_value_heads: int | None = field(
        "architecture/linear_num_value_heads", default=None, help="value heads of the linear layers"
    )
    linear_key_dim: int | None = field(
        "architecture/linear_key_head_dim", default=None, help="query/key head width of the linear layers"
    )
    linear_value_dim: int | None = field(
        "architecture/linear_value_head_dim", default=None, help="value head width of the linear layers"
    )
    conv_kernel: int | None = field(
        "architecture/linear_conv_kernel_dim", default=None, help="taps of the linear layers' convolution"
    )
    linear_chunk: int = field(
        "architecture/linear_chunk_size", default=CHUNK, above=0, help="chunk of the chunked delta rule"
    )

    def _preset(self) -> HybridPreset:
        return lookup_preset_as(self.PRESETS, self.preset, self.FAMILY, HybridPreset)

    def default_layer_types(self, n_layers: int, every: int) -> tuple[str, ...]:
        """``layer_types`` when the key is None: every ``every``-th layer full attention, the rest linear."""
        return tuple(FULL_ATTENTION if (i + 1) % every == 0 else LINEAR_ATTENTION for i in range(n_layers))

    def _extra_architecture(self) -> dict[str, Any]:
        preset = self._preset()
        n_layers = preset_or(self.n_layers, preset.n_layers)
        types = self.layer_types
        if types is None:
            every = preset_or(self.full_attention_interval, preset.full_attention_interval)
            if every < 1:
                raise ConfigError(f"architecture/full_attention_interval={every} must be at least 1")
            types = self.default_layer_types(n_layers, every)
        if not set(types) <= {FULL_ATTENTION, LINEAR_ATTENTION}:
            raise ConfigError(
                f"architecture/layer_types={list(types)}: {self.LINEAR_FAMILY} has linear_attention and "
                "full_attention; use those"
            )
        return {**super()._extra_architecture(), "layer_types": tuple(types)}

    def linear_extras(self, arch: Architecture) -> dict[str, Any]:
        """A family's own fields of its linear layers' architecture (or ``arch``'s that it sets otherwise)."""
        return {}

    def resolve_architecture(self) -> Architecture:
        arch = super().resolve_architecture()
        preset = self._preset()
        names = [f.name for f in dataclasses.fields(DeltaNetShape)]  # the model's keys of the same names
        shape = {name: preset_or(getattr(self, name), getattr(preset, name)) for name in names}
        kind = getattr(self.BLOCK, "LINEAR_ARCHITECTURE", Qwen3NextArchitecture)
        return extend_architecture(arch, kind, **shape, linear_chunk=int(self.linear_chunk), **self.linear_extras(arch))

    def _linear_option(self, layer: int) -> dict[str, Any]:
        """The block's ``linear`` (:class:`HybridBlock`): whether ``layer`` is a ``linear_attention`` layer."""
        types = self.architecture.layer_types or ()
        return {"linear": types[layer] == LINEAR_ATTENTION}

    def _layer_options(self, layer: int) -> dict[str, Any]:
        return {**super()._layer_options(layer), **self._linear_option(layer)}


class Qwen3NextHybrid(LinearAttentionLM, Qwen3):
    """Qwen3-Next's layers with dense SwiGLU feed-forwards, the base of :class:`Qwen3Next` and of the dense
    Qwen3.5: pre-norm blocks whose RMSNorms are zero-centred (``1 + scale``: the block norms, the final
    norm and the per-head query/key norms; the Gated DeltaNet's output norm has a plain scale),
    ``architecture/layer_types`` of ``linear_attention`` (a :class:`GatedDeltaNet`: ``architecture/
    linear_num_key_heads`` query/key heads of ``linear_key_head_dim``, ``linear_num_value_heads`` value
    heads of ``linear_value_head_dim``, a causal convolution of ``linear_conv_kernel_dim``, the delta
    rule in chunks of ``architecture/linear_chunk_size``) and ``full_attention`` layers
    (:class:`Qwen3NextAttention`: gated outputs, partial RoPE); default every
    ``architecture/full_attention_interval``-th layer full (:class:`LinearAttentionLM`). The head is untied.
    Its presets are :class:`HybridPreset` (a plain :class:`Preset` takes the Gated DeltaNet's default shape).

    The two kinds of layer have different parameters: a scanned model (``model/scan_layers``) runs one
    period of ``layer_types`` per scan step, each position a layer of its own.
    """

    BLOCK = HybridBlock
    TIED_EMBEDDINGS: ClassVar[bool] = False

    def _extra_architecture(self) -> dict[str, Any]:
        return {**super()._extra_architecture(), "zero_centred_norm": True}


class Qwen3Next(MixtureLM, Qwen3NextHybrid):
    """Qwen3-Next: :class:`Qwen3NextHybrid`'s layers (Gated DeltaNet and gated full attention, zero-centred
    norms, untied head) whose feed-forwards are softmax-routed
    mixtures with ``norm_topk_prob`` and a gated shared expert of ``architecture/moe/shared_expert_hidden``
    (:class:`Qwen3NextMoE`); ``architecture/moe/first_k_dense`` leading layers are dense. The head is untied.

    The two kinds of layer have different parameters: a scanned model (``model/scan_layers``) runs one
    period of ``layer_types`` per scan step, each position a layer of its own. Presets: ``tiny`` and
    ``qwen3-next-80b-a3b`` (79.7B parameters, 3.9B active, at ``architecture/vocab_size=151936``; the
    releases use ``architecture/rope_theta=1e7``, which ``hf/import`` reads from ``config.json``).
    ``hf/import`` of ``model_type: qwen3_next`` builds it.
    """

    PRESETS: ClassVar[dict[str, Preset]] = QWEN3_NEXT_PRESETS
    FAMILY: ClassVar[str] = "Qwen3Next"
    BLOCK = Qwen3NextBlock  # type: ignore[assignment]  # a HybridBlock with Qwen3-Next's shared expert

    shared_expert_hidden: int | None = optional_key(
        "architecture/moe/shared_expert_hidden",
        "Qwen3-Next: width of the gated shared expert",
        "the preset's, else expert_hidden; 0: none",
    )

    def resolve_architecture(self) -> Architecture:
        arch = super().resolve_architecture()
        preset = self._preset()
        declared = preset.shared_expert_hidden if isinstance(preset, Qwen3NextPreset) else None
        moe_hidden = arch.moe.expert_hidden if arch.moe is not None else 0
        shared = declared if self.shared_expert_hidden is None else self.shared_expert_hidden
        hidden = int(moe_hidden if shared is None else shared)
        return dataclasses.replace(arch, shared_expert_hidden=hidden).validate()  # type: ignore[call-arg]

    def _layer_options(self, layer: int) -> dict[str, Any]:
        return {**super()._layer_options(layer), **self._linear_option(layer)}


__all__ = [
    "QWEN3_NEXT_PRESETS",
    "DeltaNetShape",
    "HybridBlock",
    "HybridPreset",
    "LinearAttentionLM",
    "Qwen3Next",
    "Qwen3NextArchitecture",
    "Qwen3NextAttention",
    "Qwen3NextBlock",
    "Qwen3NextHybrid",
    "Qwen3NextMoE",
    "Qwen3NextPreset",
]
