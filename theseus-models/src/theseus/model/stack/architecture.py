"""Size presets and the resolved ``Architecture`` of a model (its FLOPs are its layers' own counts:
``TransformerLM.flops``)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, TypeVar

from theseus.errors import ConfigError
from theseus.model.layers.attention import (
    CHUNKED_ATTENTION,
    FULL_ATTENTION,
    LINEAR_ATTENTION,
    SLIDING_ATTENTION,
    AttentionSpec,
)
from theseus.model.layers.hyper_connections import HyperSpec
from theseus.model.layers.mamba2 import MAMBA
from theseus.model.layers.mlp import MLP_LAYER, FeedForwardSpec, hidden_size
from theseus.model.layers.moe import MoESpec
from theseus.model.layers.norms import NormSpec
from theseus.model.layers.rotary import PositionSpec, RopeScaling
from theseus.model.layers.short_conv import SHORT_CONV

#: ``Architecture.layer_types`` entries (transformers' names; chunked layers are Llama 4's alone, linear
#: ones Qwen3-Next's, short-convolution ones LFM2's, Mamba-2 and feed-forward-only ones Nemotron-H's).
LAYER_TYPES = (SLIDING_ATTENTION, FULL_ATTENTION, CHUNKED_ATTENTION, LINEAR_ATTENTION, SHORT_CONV, MAMBA, MLP_LAYER)


@dataclass(frozen=True)
class Preset:
    """A named network shape. ``mlp_ratio`` and ``ffn_multiple`` give ``d_ff`` from ``n_embd``."""

    n_layers: int
    n_heads: int
    n_embd: int
    n_kv_heads: int | None = None  # None: n_heads (multi-head attention)
    head_dim: int | None = None  # None: n_embd / n_heads
    mlp_ratio: float = 4.0
    ffn_multiple: int = 1
    description: str = ""


PresetT = TypeVar("PresetT", bound=Preset)


@dataclass(frozen=True)
class Architecture:
    """Every size and switch of one model, resolved from its preset and explicit keys: the model-wide
    sizes here, and one spec per concern, each validated by its own ``validate()``: ``attention``
    (:class:`AttentionSpec`: heads, biases, query/key norms, score scale and cap, window),
    ``norm`` (:class:`NormSpec`: kind, epsilon, placement, zero-centred), ``position``
    (:class:`PositionSpec`: RoPE base and scaling, the sliding layers' base, or learned / none) and
    ``feed_forward`` (:class:`FeedForwardSpec`: width, activation, bias, the mixture's
    :class:`MoESpec`). A family builds it once from its resolved keys (:meth:`from_keys`).

    ``scale_embeddings``: token embeddings times ``sqrt(n_embd)`` (in the activation dtype).
    ``final_softcap``: output logits capped as ``tanh(x / cap) * cap``. ``layer_types``: one
    ``"sliding_attention"`` / ``"full_attention"`` per layer: only the sliding layers have the
    attention's ``sliding_window``, and they rotate with the position's ``local_theta`` and without
    its ``scaling``, which then scales the full layers only (Gemma 3). The mup-style multipliers of
    Falcon-H1 and Granite: ``embedding_multiplier`` on the token embeddings, ``residual_multiplier`` on
    every branch's output before its residual sum, ``logits_multiplier`` on the logits (before the cap).
    ``hyper``: the residual is :class:`~theseus.model.layers.hyper_connections.HyperSpec`'s streams (None:
    one residual sum).
    """

    n_layers: int
    n_embd: int
    vocab_size: int
    block_size: int
    attention: AttentionSpec
    norm: NormSpec
    position: PositionSpec
    feed_forward: FeedForwardSpec
    tied_embeddings: bool
    dropout: float
    vocab_multiple: int = 1
    scale_embeddings: bool = False
    final_softcap: float | None = None
    layer_types: tuple[str, ...] | None = None
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    logits_multiplier: float = 1.0
    hyper: HyperSpec | None = None

    @classmethod
    def from_keys(cls, **keys: Any) -> Architecture:
        """The architecture of a family's resolved keys (the flat names ``resolve_architecture`` and
        ``_extra_architecture`` give: ``n_heads``, ``norm_eps``, ``rope_theta``, ``d_ff``...), each
        concern's grouped into its spec. ``use_bias`` is the family's default for every bias
        (LayerNorm's included); ``attention_bias`` (query/key/value), ``attention_out_bias``
        (attention output; default: as the query/key/value ones) and ``mlp_bias`` override it;
        ``zero_centred_norm`` applies to every RMSNorm, the query/key norms included."""
        rest = dict(keys)
        use_bias, zero_centred = rest.pop("use_bias"), rest.pop("zero_centred_norm", False)
        norm = NormSpec(
            kind=rest.pop("norm"),
            eps=rest.pop("norm_eps"),
            placement=rest.pop("norm_placement", "pre"),
            zero_centred=zero_centred,
            bias=use_bias,
        )
        attention = _attention_of(rest, use_bias, norm)
        mlp_bias = rest.pop("mlp_bias", None)
        feed_forward = FeedForwardSpec(
            d_ff=rest.pop("d_ff"),
            activation=rest.pop("activation"),
            bias=use_bias if mlp_bias is None else mlp_bias,
            moe=rest.pop("moe", None),
        )
        return cls(attention=attention, norm=norm, position=_position_of(rest), feed_forward=feed_forward, **rest)

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the token embedding and columns of the output head: ``vocab_size`` rounded up to
        a multiple of ``vocab_multiple`` (the ids past ``vocab_size`` are never produced: their
        logits are masked out of the loss and cut from the returned logits)."""
        return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple

    @property
    def head_dim(self) -> int:
        return self.attention.width(self.n_embd)

    @property
    def moe(self) -> MoESpec | None:
        """The mixture of experts of every layer from ``moe.first_k_dense`` on (None: a dense model)."""
        return self.feed_forward.moe

    @property
    def gated(self) -> bool:
        return self.feed_forward.gated

    @property
    def moe_layers(self) -> int:
        """Layers whose feed-forward is the mixture (0 for a dense model)."""
        return 0 if self.moe is None else self.n_layers - self.moe.first_k_dense

    def inactive_params(self) -> int:
        """Parameters a token does not pass through: the routed experts it did not choose (0 when dense)."""
        return 0 if self.moe is None else self.moe_layers * self.moe.inactive_params(self.n_embd, self.gated)

    def with_mixture(self, moe: MoESpec | None) -> Architecture:
        """This architecture with the feed-forward mixture ``moe``."""
        return dataclasses.replace(self, feed_forward=dataclasses.replace(self.feed_forward, moe=moe))

    def _validate_rotary(self) -> None:
        """The rotated heads' width is even (a family whose attention rotates another width overrides this)."""
        if self.position.rotary and self.head_dim % 2:
            raise ConfigError(
                f"rotary embeddings need an even head dimension, got {self.head_dim}; "
                "change architecture/head_dim, architecture/n_embd or architecture/n_heads"
            )

    def _validate_multipliers(self) -> None:
        for key in ("embedding_multiplier", "residual_multiplier", "logits_multiplier"):
            value = getattr(self, key)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise ConfigError(f"architecture/{key} must be a finite number, got {value!r}")

    def _validate_layer_types(self) -> None:
        if self.layer_types is None:
            return
        types = list(self.layer_types)
        if len(types) != self.n_layers or not set(types) <= set(LAYER_TYPES):
            raise ConfigError(
                f"architecture/layer_types={types!r} must list {self.n_layers} entries (one per layer), "
                f"each {LAYER_TYPES[0]!r} or {LAYER_TYPES[1]!r} ({LAYER_TYPES[2]!r}: Llama 4; {LAYER_TYPES[3]!r}: "
                f"Qwen3-Next; {LAYER_TYPES[4]!r}: LFM2; {LAYER_TYPES[5]!r}, {LAYER_TYPES[6]!r}: Nemotron-H)"
            )
        if LAYER_TYPES[0] in types and self.attention.sliding_window is None:
            raise ConfigError(
                "architecture/layer_types has sliding_attention layers but architecture/sliding_window is null; set it"
            )

    def validate(self) -> Architecture:
        for key, value in (
            ("n_layers", self.n_layers),
            ("n_embd", self.n_embd),
            ("vocab_size", self.vocab_size),
            ("vocab_multiple", self.vocab_multiple),
            ("block_size", self.block_size),
        ):
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"architecture/{key} must be a positive integer, got {value!r}")
        self.attention.validate(self.n_embd, self.block_size)
        self._validate_rotary()
        self.position.validate()
        self.feed_forward.validate(self.n_layers)
        self.norm.validate()
        self._validate_layer_types()
        self._validate_multipliers()
        if self.hyper is not None:
            self.hyper.validate()
        if self.final_softcap is not None and not self.final_softcap > 0:
            raise ConfigError(f"architecture/final_softcap must be positive or null, got {self.final_softcap!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"architecture/dropout must be in [0, 1), got {self.dropout}")
        return self


def _attention_of(keys: dict[str, Any], use_bias: bool, norm: NormSpec) -> AttentionSpec:
    """The attention spec of resolved keys (taken out of ``keys``)."""
    attention_bias = keys.pop("attention_bias", None)
    qkv_bias = use_bias if attention_bias is None else attention_bias
    out_bias = keys.pop("attention_out_bias", None)
    return AttentionSpec(
        n_heads=keys.pop("n_heads"),
        n_kv_heads=keys.pop("n_kv_heads"),
        head_dim=keys.pop("explicit_head_dim", None),
        qkv_bias=qkv_bias,
        out_bias=qkv_bias if out_bias is None else out_bias,
        qk_norm=keys.pop("qk_norm", False),
        qk_norm_span=keys.pop("qk_norm_span", "head"),
        qk_norm_zero_centred=norm.zero_centred,
        norm_eps=norm.eps,
        query_pre_attn_scalar=keys.pop("query_pre_attn_scalar", None),
        softcap=keys.pop("attn_softcap", None),
        sliding_window=keys.pop("sliding_window", None),
        implementation=keys.pop("attention_impl"),
    )


def _position_of(keys: dict[str, Any]) -> PositionSpec:
    """The position spec of resolved keys (taken out of ``keys``)."""
    rotary, learned = keys.pop("rotary"), keys.pop("learned_positions")
    return PositionSpec(
        kind="rope" if rotary else "learned" if learned else "none",
        theta=keys.pop("rope_theta"),
        scaling=keys.pop("rope_scaling", RopeScaling()),
        local_theta=keys.pop("local_rope_theta", None),
    )


def preset_d_ff(preset: Preset, n_embd: int, mlp_ratio: float | None) -> int:
    ratio = preset.mlp_ratio if mlp_ratio is None else mlp_ratio
    return hidden_size(n_embd, None, ratio, preset.ffn_multiple)


def lookup_preset(presets: dict[str, Preset], name: str, family: str) -> Preset:
    if name not in presets:
        raise ConfigError(f"unknown architecture/preset {name!r} for {family}; choose one of {', '.join(presets)}")
    return presets[name]


ArchitectureT = TypeVar("ArchitectureT", bound="Architecture")


def extend_architecture(arch: Architecture, kind: type[ArchitectureT], **extra: Any) -> ArchitectureT:
    """``arch``'s :class:`Architecture` fields and a family's ``extra`` ones (which may set one of those
    fields its own way) as a validated ``kind``."""
    values = {f.name: getattr(arch, f.name) for f in dataclasses.fields(Architecture)}
    built = kind(**{**values, **extra})
    built.validate()
    return built


def architecture_as(arch: Architecture, kind: type[ArchitectureT], message: str) -> ArchitectureT:
    """``arch`` as a family's ``kind``, or ``message`` (which layers need it, which model builds one)."""
    if not isinstance(arch, kind):
        raise ConfigError(message)
    return arch


def preset_or(value: int | None, default: int) -> int:
    """An explicit key's value, or the preset's ``default`` where the key is None."""
    return default if value is None else int(value)


def preset_as(preset: Preset, kind: type[PresetT], **changes: Any) -> PresetT:
    """``preset`` as a ``kind``: each field of ``kind`` that ``preset`` has keeps its value (the others take
    ``kind``'s defaults), then ``changes`` (another family's preset, or one of the same family, restated)."""
    names = {f.name for f in dataclasses.fields(kind)}
    values = {f.name: getattr(preset, f.name) for f in dataclasses.fields(preset) if f.name in names}
    return kind(**{**values, **changes})


def lookup_preset_as(presets: dict[str, Preset], name: str, family: str, kind: type[PresetT]) -> PresetT:
    """The preset ``name`` as a ``kind`` (a :class:`Preset` subclass): one of another class (a preset of the
    family's base, such as a plain :class:`Preset`) keeps its :class:`Preset` fields and takes ``kind``'s
    defaults for the others."""
    preset = lookup_preset(presets, name, family)
    if isinstance(preset, kind):
        return preset
    return kind(**{f.name: getattr(preset, f.name) for f in dataclasses.fields(Preset)})
