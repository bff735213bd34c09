"""``Gemma4`` (text): Gemma 3's layers with plain-scale RMSNorms, unscaled attention scores, scale-free
value norms, wider full-attention heads rotated by proportional RoPE, per-layer input embeddings and a
scalar on each layer's output.

The mechanisms only this family has live here: :class:`Gemma4Attention` (a layer's heads by its kind, the
value norm, keys reused as values, the full layers' proportional RoPE from
:func:`~theseus.model.layers.rotary.rotate`), :class:`PerLayerInput` and :class:`LayerScalar` (what
:class:`Gemma4Block` adds after Gemma's sandwich), and the per-layer inputs, which the model computes
once from the tokens and hands from layer to layer with the hidden state (:class:`Carry`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from theseus.base.axis import Axis
from theseus.config import field
from theseus.errors import ConfigError
from theseus.model.layers._common import INIT_STD, cast, child, constrain, normal, optional_key, param
from theseus.model.layers.attention import FULL_ATTENTION, AttentionSpec, CausalSelfAttention
from theseus.model.layers.context_parallel import to_balanced
from theseus.model.layers.embedding import TokenEmbedding
from theseus.model.layers.norms import RMSNorm
from theseus.model.layers.rotary import proportional_pairs, rotate
from theseus.model.models.gemma.model import Gemma3, softcap
from theseus.model.models.llama4.model import l2_norm
from theseus.model.module import Module
from theseus.model.stack import pipeline
from theseus.model.stack.architecture import (
    Architecture,
    Preset,
    extend_architecture,
    lookup_preset_as,
)
from theseus.model.stack.block import Block, LayerCall
from theseus.model.stack.windows import pattern_layer_types


@dataclass(frozen=True)
class Gemma4Preset(Preset):
    """A :class:`Preset` with the full-attention layers' head width (``global_head_dim``; None: 2 x
    ``head_dim``) and the per-layer inputs' width (``per_layer_dim``; 0: none)."""

    global_head_dim: int | None = None
    per_layer_dim: int = 0


GEMMA4_PRESETS: dict[str, Preset] = {
    "tiny": Gemma4Preset(
        n_layers=6,
        n_heads=4,
        n_kv_heads=1,
        n_embd=128,
        head_dim=32,
        global_head_dim=64,
        per_layer_dim=16,
        description="1.59M parameters at vocab 384 (full layer 5: heads of 64), per-layer inputs of 16; tests",
    ),
}


@dataclass(frozen=True)
class Gemma4Architecture(Architecture):
    """An :class:`Architecture` with what Gemma 4's full-attention layers change (``global_head_dim``,
    ``global_kv_heads``, ``k_eq_v``: values are the keys as projected, ``rope_fraction``: the pairs that
    turn in their proportional RoPE) and the per-layer inputs (``per_layer_dim`` wide, 0: none, a table of
    ``per_layer_vocab`` rows)."""

    global_head_dim: int = 512
    global_kv_heads: int | None = None
    k_eq_v: bool = False
    rope_fraction: float = 0.25
    per_layer_dim: int = 0
    per_layer_vocab: int = 0

    def full_attention(self) -> AttentionSpec:
        """The attention of the ``full_attention`` layers: ``global_head_dim`` wide heads, ``global_kv_heads``."""
        kv = self.attention.kv_heads if self.global_kv_heads is None else self.global_kv_heads
        return dataclasses.replace(self.attention, head_dim=self.global_head_dim, n_kv_heads=kv)

    def layer_attention(self, layer: int) -> AttentionSpec:
        """The attention of layer ``layer``, by its ``layer_types`` entry."""
        return self.full_attention() if self.full(layer) else self.attention

    def full(self, layer: int) -> bool:
        return (self.layer_types or ())[layer] == FULL_ATTENTION

    @property
    def padded_per_layer_vocab(self) -> int:
        return -(-self.per_layer_vocab // self.vocab_multiple) * self.vocab_multiple

    def _validate_rotary(self) -> None:
        super()._validate_rotary()
        if self.global_head_dim % 2:
            raise ConfigError(f"architecture/global_head_dim={self.global_head_dim} must be even (rotary)")
        proportional_pairs(self.global_head_dim, self.rope_fraction)

    def validate(self) -> Gemma4Architecture:
        super().validate()
        self.full_attention().validate(self.n_embd, self.block_size)
        if self.per_layer_dim < 0:
            raise ConfigError(
                f"architecture/per_layer_input_dim must be 0 (none) or positive, got {self.per_layer_dim}"
            )
        if self.per_layer_dim and self.per_layer_vocab < self.vocab_size:
            raise ConfigError(
                f"architecture/per_layer_vocab_size={self.per_layer_vocab} must be at least "
                f"architecture/vocab_size={self.vocab_size}"
            )
        return self


class Carry(NamedTuple):
    """What one Gemma 4 layer hands the next: the hidden state ``[B, T, n_embd]``, every layer's input
    ``[B, T, n_layers, per_layer_dim]`` (None without per-layer inputs) and the index of the next layer
    (counted in the carry, so that scanned units, whose positions know only their layer type, read their own)."""

    hidden: jax.Array
    per_layer: jax.Array | None
    index: jax.Array  # type: ignore[assignment]  # shadows tuple.index, never called on a carry


class Gemma4Attention(CausalSelfAttention):
    """:class:`CausalSelfAttention` of a Gemma 4 layer of one kind (``full``, from its block; its ``spec``
    has that kind's heads): values normalised per head without a scale (and, with ``k_eq_v``, the keys as
    projected, no ``value`` projection); a sliding layer rotates with the position's ``local_theta`` within the
    window, a full one with proportional RoPE (the first ``rope_fraction`` of its pairs turn, at the whole
    head's frequencies; base ``theta``, ``scaling``) over the whole sequence."""

    full: bool = False
    k_eq_v: bool = False
    rope_fraction: float = 1.0

    def _layer_window(self, layer: int | jax.Array | None) -> int | jax.Array | None:
        return None if self.full else self.attention_spec.sliding_window

    def _rotate(
        self, q: jax.Array, k: jax.Array, positions: jax.Array | None, layer: int | jax.Array | None
    ) -> tuple[jax.Array, jax.Array]:
        spec = self.position_spec
        if not self.full:
            return rotate(q, positions, spec.local), rotate(k, positions, spec.local)
        turning = proportional_pairs(q.shape[-1], self.rope_fraction)
        return (
            rotate(q, positions, spec.theta, spec.scaled, turning),
            rotate(k, positions, spec.theta, spec.scaled, turning),
        )

    def _values(self, x: jax.Array, k: jax.Array, n_kv: int, head_dim: int, deterministic: bool) -> jax.Array:
        v = k if self.k_eq_v else super()._values(x, k, n_kv, head_dim, deterministic)
        return l2_norm(v, self.attention_spec.norm_eps)

    def matmul_params(self) -> int:
        """The projections; without the ``value`` one when the keys are the values."""
        n_embd = self._width()
        _, n_kv, head_dim = self._heads(n_embd)
        return super().matmul_params() - (n_embd * n_kv * head_dim if self.k_eq_v else 0)


class PerLayerInput(Module):
    """A layer's per-layer input branch, after its feed-forward: ``norm(out(gelu(x @ gate) * per_layer))``
    (``gate`` ``[n_embd, per_layer_dim]``, ``out`` ``[per_layer_dim, n_embd]``, ``norm`` an RMSNorm of
    ``n_embd``), added to the residual stream by the block."""

    per_layer_dim: int = 0
    eps: float = 1e-6
    out_std: float = INIT_STD

    @nn.compact
    def __call__(self, x: jax.Array, per_layer: jax.Array) -> jax.Array:
        dtype, n_embd = self._activation_dtype, x.shape[-1]
        gate = param(self, "gate", normal(INIT_STD), (n_embd, self.per_layer_dim), (Axis.EMBED, None))
        out = param(self, "out", normal(self.out_std), (self.per_layer_dim, n_embd), (None, Axis.EMBED))
        h = jnp.einsum("bte,ep->btp", cast(x, dtype), cast(gate, dtype))
        h = jax.nn.gelu(h, approximate=True) * cast(per_layer, dtype)
        y = jnp.einsum("btp,pe->bte", h, cast(out, dtype))
        return child(self, RMSNorm, eps=self.eps, name="norm")(y)


class LayerScalar(Module):
    """A layer's output times ``scale`` ``[1]`` (ones; Gemma 4's ``layer_scalar``, fixed in the releases)."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        scale = param(self, "scale", nn.initializers.ones_init(), (1,), (None,))
        return x * cast(scale, x.dtype)


class Gemma4Block(Block):
    """:class:`Block` of Gemma 4, called with a :class:`Carry`: Gemma's sandwich of attention
    (:class:`Gemma4Attention` with the heads of its kind: ``full`` from the model's ``layer_types``) and
    MLP, then, with per-layer inputs, ``x + per_layer_input(x, its input)`` (:class:`PerLayerInput`), then
    ``layer_scalar`` (:class:`LayerScalar`)."""

    ATTENTION: ClassVar[type[CausalSelfAttention]] = Gemma4Attention

    full: bool = False

    @classmethod
    def components(cls) -> list[type]:
        return [*super().components(), PerLayerInput, LayerScalar]

    @property
    def gemma4(self) -> Gemma4Architecture:
        arch = self.arch
        if not isinstance(arch, Gemma4Architecture):
            raise ConfigError("Gemma4Block needs a Gemma4Architecture (model/gemma4)")
        return arch

    def setup(self) -> None:
        super().setup()
        arch = self.gemma4
        if arch.per_layer_dim:
            self.per_layer_input = child(
                self, PerLayerInput, per_layer_dim=arch.per_layer_dim, eps=arch.norm.eps, out_std=self.out_std
            )
        self.layer_scalar = child(self, LayerScalar)

    def attention(self) -> Module:
        arch = self.gemma4
        return child(
            self,
            self.ATTENTION,
            n_embd=arch.n_embd,
            dropout=arch.dropout,
            spec=arch.full_attention() if self.full else arch.attention,
            position=arch.position,
            layer_types=arch.layer_types,
            out_std=self.out_std,
            full=self.full,
            k_eq_v=arch.k_eq_v and self.full,
            rope_fraction=arch.rope_fraction,
        )

    def flops(self, seq: int, layer: int | None = None) -> int:
        if self.scope is None:
            return self.bind({}).flops(seq, layer)
        extra = 6 * seq * 2 * self.gemma4.per_layer_dim * self.gemma4.n_embd
        return super().flops(seq, layer) + extra

    def forward(self, x: Carry, call: LayerCall, layer: int | jax.Array | None) -> Carry:  # type: ignore[override]
        h = super().forward(x.hidden, call, layer)
        if x.per_layer is not None:
            mine = jax.lax.dynamic_index_in_dim(x.per_layer, x.index, axis=2, keepdims=False)
            h = h + self.per_layer_input(h, mine)
        h = constrain(self.layer_scalar(h), (Axis.BATCH, Axis.SEQUENCE, Axis.EMBED))
        return Carry(h, x.per_layer, x.index + 1)


class Gemma4(Gemma3):
    """Gemma 4 (text): :class:`Gemma3`'s layers (GeGLU, sandwich norms, per-head query/key norms, embeddings
    times ``sqrt(n_embd)``, a tied head, sliding layers with a window of 512 and every sixth layer full, the
    last layer always full) with these changes:

    - every RMSNorm multiplies by its plain ``scale`` (not ``1 + scale``); values are RMS-normalised per head
      without a scale; attention scores are not scaled (``architecture/query_pre_attn_scalar`` None: 1);
    - full-attention layers have heads of ``architecture/global_head_dim`` (None: the preset's) and
      ``architecture/global_kv_heads`` key/value heads (None: ``n_kv_heads``), and with
      ``architecture/attention_k_eq_v`` no value projection (the keys as projected are the values); they
      rotate with proportional RoPE of base ``architecture/rope_theta`` (the first
      ``architecture/partial_rotary_factor`` of the head's pairs turn, default 0.25), the sliding layers
      with ``architecture/rope_local_theta``;
    - per-layer inputs of ``architecture/per_layer_input_dim`` (None: the preset's; 0: none): a table of
      ``architecture/per_layer_vocab_size`` rows (None: ``vocab_size``) gives each token
      ``n_layers x per_layer_input_dim`` values (times ``sqrt(per_layer_input_dim)``), added to an RMS-normed
      projection of its embedding (times ``n_embd ** -0.5``) and scaled by ``2 ** -0.5``; layer ``i`` gates
      its slice in after its MLP (:class:`PerLayerInput`);
    - each layer's output is multiplied by its ``layer_scalar``; no soft-capping by default
      (``architecture/final_softcap``, the releases' 30, is read from ``config.json``).

    The two kinds of layer have different shapes: a scanned model (``model/scan_layers``) runs one period
    of ``layer_types`` per scan step, each position a layer of its own; ``mesh/pipeline`` is not supported.
    Presets: ``tiny``. ``hf/import`` of ``model_type: gemma4_text`` (or the language model of a ``gemma4``
    checkpoint) builds this model.
    """

    PRESETS: ClassVar[dict[str, Preset]] = GEMMA4_PRESETS
    FAMILY: ClassVar[str] = "Gemma4"
    BLOCK = Gemma4Block
    FINAL_SOFTCAP: ClassVar[float | None] = None

    global_head_dim: int | None = optional_key(
        "architecture/global_head_dim", "Gemma 4: head width of the full layers", "preset's"
    )
    global_kv_heads: int | None = optional_key(
        "architecture/global_kv_heads", "Gemma 4: key/value heads of the full layers", "architecture/n_kv_heads"
    )
    attention_k_eq_v: bool = field(
        "architecture/attention_k_eq_v",
        default=False,
        help="Gemma 4: full layers have no value projection; the keys as projected are the values",
    )
    partial_rotary_factor: float = field(
        "architecture/partial_rotary_factor",
        default=0.25,
        help="Gemma 4: the fraction of a full layer's RoPE pairs that turn (proportional RoPE)",
    )
    per_layer_input_dim: int | None = optional_key(
        "architecture/per_layer_input_dim", "Gemma 4: width of each layer's per-layer input", "the preset's; 0: none"
    )
    per_layer_vocab_size: int | None = optional_key(
        "architecture/per_layer_vocab_size", "Gemma 4: rows of the per-layer input table", "architecture/vocab_size"
    )

    def _preset(self) -> Gemma4Preset:
        return lookup_preset_as(self.PRESETS, self.preset, self.FAMILY, Gemma4Preset)

    def resolved_layer_types(self) -> tuple[str, ...]:
        """``architecture/layer_types``, or every sixth layer full; the last layer is always full (as
        transformers makes it)."""
        if self.layer_types is not None:
            types = list(self.layer_types)
        else:
            preset = self._preset()
            n_layers = preset.n_layers if self.n_layers is None else self.n_layers
            types = list(pattern_layer_types(n_layers, self.FULL_EVERY))
        if types and types[-1] != FULL_ATTENTION:
            raise ConfigError(f"architecture/layer_types={types}: Gemma 4's last layer is full_attention")
        return tuple(types)

    def _extra_architecture(self) -> dict[str, Any]:
        scalar = 1.0 if self.query_pre_attn_scalar is None else self.query_pre_attn_scalar
        return {
            **super()._extra_architecture(),
            "zero_centred_norm": False,
            "query_pre_attn_scalar": scalar,
            "attn_softcap": softcap(self.attn_softcap, None),
            "final_softcap": softcap(self.final_softcap, self.FINAL_SOFTCAP),
        }

    def resolve_architecture(self) -> Architecture:
        arch = super().resolve_architecture()
        preset = self._preset()
        global_head_dim = self.global_head_dim or preset.global_head_dim or 2 * arch.head_dim
        per_layer = preset.per_layer_dim if self.per_layer_input_dim is None else self.per_layer_input_dim
        return extend_architecture(
            arch,
            Gemma4Architecture,
            global_head_dim=int(global_head_dim),
            global_kv_heads=self.global_kv_heads,
            k_eq_v=bool(self.attention_k_eq_v),
            rope_fraction=float(self.partial_rotary_factor),
            per_layer_dim=int(per_layer),
            per_layer_vocab=int(self.per_layer_vocab_size or arch.vocab_size),
        )

    def _layer_options(self, layer: int) -> dict[str, Any]:
        arch = self.architecture
        full = isinstance(arch, Gemma4Architecture) and arch.full(layer)
        return {**super()._layer_options(layer), "full": full}

    # ----------------------------------------------------------------- per-layer inputs

    def setup(self) -> None:
        super().setup()
        arch = self.gemma4
        if arch.per_layer_dim:
            width = arch.n_layers * arch.per_layer_dim
            self.per_layer_embedding = child(self, TokenEmbedding, vocab_size=arch.padded_per_layer_vocab, n_embd=width)
            self.per_layer_projection = param(
                self, "per_layer_projection", normal(INIT_STD), (arch.n_embd, width), (Axis.EMBED, None)
            )
            self.per_layer_norm = child(self, RMSNorm, eps=arch.norm.eps)

    @property
    def gemma4(self) -> Gemma4Architecture:
        arch = self.architecture
        if not isinstance(arch, Gemma4Architecture):
            raise ConfigError("Gemma4 resolved an architecture that is not a Gemma4Architecture")
        return arch

    def per_layer_inputs(self, ids: jax.Array, embedded: jax.Array) -> jax.Array:
        """Every layer's input ``[B, T, n_layers, per_layer_dim]`` of token ``ids`` and their scaled
        embeddings ``embedded``: the table's rows (times ``sqrt(per_layer_dim)``) plus the RMS-normed
        projection of the embeddings (times ``n_embd ** -0.5``), times ``2 ** -0.5``."""
        arch = self.gemma4
        dtype, shape = embedded.dtype, (*ids.shape, arch.n_layers, arch.per_layer_dim)
        tokens = self.per_layer_embedding(ids)
        tokens = (tokens * jnp.asarray(math.sqrt(arch.per_layer_dim), tokens.dtype)).reshape(shape)
        projected = jnp.einsum("bte,ep->btp", embedded, cast(self.per_layer_projection, dtype))
        projected = self.per_layer_norm((projected * jnp.asarray(arch.n_embd**-0.5, dtype)).reshape(shape))
        return ((projected + tokens.astype(dtype)) * jnp.asarray(2.0**-0.5, dtype)).astype(dtype)

    def _embedded(
        self, x: jax.Array, padding_mask: jax.Array | None, deterministic: bool, decode: bool
    ) -> tuple[Any, LayerCall, Any, tuple[jax.Array | None, jax.Array | None]]:
        """The embedded tokens as a :class:`Carry` with every layer's input (in the order the layers see
        the tokens: the context axis's balanced order when the sequence is split)."""
        h, call, order, given = super()._embedded(x, padding_mask, deterministic, decode)
        per_layer = None
        if self.gemma4.per_layer_dim:
            ids = jnp.asarray(x) if order is None else to_balanced(jnp.asarray(x), order)
            per_layer = constrain(self.per_layer_inputs(ids, h), (Axis.BATCH, Axis.SEQUENCE, None, None))
        return Carry(h, per_layer, jnp.zeros((), jnp.int32)), call, order, given

    def _layers(self, h: Any, call: LayerCall) -> jax.Array:
        if pipeline.pipeline_size() > 1:
            raise ConfigError("Gemma 4's layers pass per-layer inputs along; mesh/pipeline is not supported for it")
        carried: Any = super()._layers(h, call)
        return carried.hidden

    def flops(self, seq: int) -> int:
        """:meth:`TransformerLM.flops` plus the per-layer inputs' projection of the embeddings."""
        arch = self.gemma4
        return super().flops(seq) + 6 * seq * arch.n_embd * arch.n_layers * arch.per_layer_dim


__all__ = [
    "GEMMA4_PRESETS",
    "Carry",
    "Gemma4",
    "Gemma4Architecture",
    "Gemma4Attention",
    "Gemma4Block",
    "Gemma4Preset",
    "LayerScalar",
    "PerLayerInput",
]
