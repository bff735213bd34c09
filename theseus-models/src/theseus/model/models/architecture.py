"""Size presets and the resolved ``Architecture`` of a model (its FLOPs are its layers' own counts:
``TransformerLM.flops``)."""

from __future__ import annotations

from dataclasses import dataclass

from theseus.errors import ConfigError
from theseus.model.layers.attention import (
    CHUNKED_ATTENTION,
    FULL_ATTENTION,
    LINEAR_ATTENTION,
    SLIDING_ATTENTION,
    AttentionSpec,
)
from theseus.model.layers.latent_attention import MLASpec
from theseus.model.layers.mlp import FeedForwardSpec, hidden_size
from theseus.model.layers.moe import MoESpec
from theseus.model.layers.norms import NormSpec
from theseus.model.layers.rotary import PositionSpec, RopeScaling

#: ``Architecture.layer_types`` entries (transformers' names; chunked layers are Llama 4's alone, linear
#: ones Qwen3-Next's).
LAYER_TYPES = (SLIDING_ATTENTION, FULL_ATTENTION, CHUNKED_ATTENTION, LINEAR_ATTENTION)


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


@dataclass(frozen=True)
class Architecture:
    """Every size and switch of one model, resolved from its preset and explicit keys.

    ``use_bias`` is the family's default for every bias (LayerNorm included);
    ``attention_bias`` (query/key/value), ``attention_out_bias`` (attention output) and
    ``mlp_bias`` override it per projection when not ``None`` (read the resolved values from
    :attr:`qkv_bias`, :attr:`out_bias`, :attr:`ffn_bias`). ``explicit_head_dim`` sets the head
    width when it is not ``n_embd / n_heads`` (read :attr:`head_dim`). ``qk_norm`` normalises each
    head's query and key (RMSNorm over ``head_dim``) before RoPE. ``sliding_window``: every layer's
    tokens attend to themselves and the ``sliding_window - 1`` tokens before them.
    ``qk_norm_span="projection"`` normalises the whole query and key projections instead of each
    head (OLMo 2). ``norm_placement="post"`` normalises each branch's output before the residual
    sum instead of its input (``x + norm(attn(x))``, OLMo 2); ``"sandwich"`` normalises both
    (``x + norm(attn(norm(x)))``, Gemma 2 and 3).

    ``zero_centred_norm``: every RMSNorm (query/key norms included) multiplies by ``1 + scale``, its
    scale starting at zeros. ``scale_embeddings``: token embeddings times ``sqrt(n_embd)`` (in the
    activation dtype). ``query_pre_attn_scalar``: attention scores scaled by its ``** -0.5`` instead
    of ``head_dim ** -0.5``. ``attn_softcap`` / ``final_softcap``: attention scores / output logits
    capped as ``tanh(x / cap) * cap``. ``layer_types``: one ``"sliding_attention"`` /
    ``"full_attention"`` per layer: only the sliding layers have ``sliding_window``, and they rotate
    with ``local_rope_theta`` (``None``: ``rope_theta``) and without ``rope_scaling``, which then
    scales the full layers only (Gemma 3).
    """

    n_layers: int
    n_heads: int
    n_kv_heads: int
    n_embd: int
    d_ff: int
    activation: str
    vocab_size: int
    block_size: int
    norm: str  # "layernorm" | "rmsnorm"
    norm_eps: float
    use_bias: bool
    rotary: bool
    rope_theta: float
    tied_embeddings: bool
    learned_positions: bool
    dropout: float
    attention_impl: str
    attention_bias: bool | None = None
    attention_out_bias: bool | None = None
    mlp_bias: bool | None = None
    explicit_head_dim: int | None = None
    rope_scaling: RopeScaling = RopeScaling()
    sliding_window: int | None = None
    vocab_multiple: int = 1
    qk_norm: bool = False
    qk_norm_span: str = "head"
    norm_placement: str = "pre"
    zero_centred_norm: bool = False
    scale_embeddings: bool = False
    query_pre_attn_scalar: float | None = None
    attn_softcap: float | None = None
    final_softcap: float | None = None
    layer_types: tuple[str, ...] | None = None
    local_rope_theta: float | None = None
    #: The mixture of experts of every layer from ``moe.first_k_dense`` on (None: a dense model).
    moe: MoESpec | None = None
    #: Multi-head latent attention in every layer (None: grouped-query attention of ``head_dim``).
    mla: MLASpec | None = None

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the token embedding and columns of the output head: ``vocab_size`` rounded up to
        a multiple of ``vocab_multiple`` (the ids past ``vocab_size`` are never produced: their
        logits are masked out of the loss and cut from the returned logits)."""
        return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_heads if self.explicit_head_dim is None else self.explicit_head_dim

    @property
    def qkv_bias(self) -> bool:
        """Whether the query, key and value projections have biases."""
        return self.use_bias if self.attention_bias is None else self.attention_bias

    @property
    def out_bias(self) -> bool:
        """Whether the attention output projection has a bias (default: as the query/key/value ones)."""
        return self.qkv_bias if self.attention_out_bias is None else self.attention_out_bias

    @property
    def ffn_bias(self) -> bool:
        """Whether the MLP projections have biases."""
        return self.use_bias if self.mlp_bias is None else self.mlp_bias

    @property
    def attention_spec(self) -> AttentionSpec:
        """The grouped-query attention of every layer."""
        return AttentionSpec(
            n_heads=self.n_heads,
            n_kv_heads=self.n_kv_heads,
            head_dim=self.explicit_head_dim,
            qkv_bias=self.qkv_bias,
            out_bias=self.out_bias,
            qk_norm=self.qk_norm,
            qk_norm_span=self.qk_norm_span,
            qk_norm_zero_centred=self.zero_centred_norm,
            norm_eps=self.norm_eps,
            query_pre_attn_scalar=self.query_pre_attn_scalar,
            softcap=self.attn_softcap,
            sliding_window=self.sliding_window,
            implementation=self.attention_impl,
        )

    @property
    def feed_forward_spec(self) -> FeedForwardSpec:
        """The feed-forward branch of every layer (an MLP, or from ``moe.first_k_dense`` on a mixture)."""
        return FeedForwardSpec(d_ff=self.d_ff, activation=self.activation, bias=self.ffn_bias, moe=self.moe)

    @property
    def norm_spec(self) -> NormSpec:
        """The normalisation layers of every block (LayerNorm's bias: ``use_bias``)."""
        return NormSpec(
            kind=self.norm,
            eps=self.norm_eps,
            placement=self.norm_placement,
            zero_centred=self.zero_centred_norm,
            bias=self.use_bias,
        )

    @property
    def position_spec(self) -> PositionSpec:
        """How tokens learn their positions (rotary, learned or none)."""
        kind = "rope" if self.rotary else "learned" if self.learned_positions else "none"
        return PositionSpec(
            kind=kind, theta=self.rope_theta, scaling=self.rope_scaling, local_theta=self.local_rope_theta
        )

    @property
    def gated(self) -> bool:
        return self.feed_forward_spec.gated

    @property
    def moe_layers(self) -> int:
        """Layers whose feed-forward is the mixture (0 for a dense model)."""
        return 0 if self.moe is None else self.n_layers - self.moe.first_k_dense

    def inactive_params(self) -> int:
        """Parameters a token does not pass through: the routed experts it did not choose (0 when dense)."""
        return 0 if self.moe is None else self.moe_layers * self.moe.inactive_params(self.n_embd, self.gated)

    def _validate_layer_types(self) -> None:
        if self.layer_types is None:
            return
        types = list(self.layer_types)
        if len(types) != self.n_layers or not set(types) <= set(LAYER_TYPES):
            raise ConfigError(
                f"architecture/layer_types={types!r} must list {self.n_layers} entries (one per layer), "
                f"each {LAYER_TYPES[0]!r} or {LAYER_TYPES[1]!r} ({LAYER_TYPES[2]!r}: Llama 4; {LAYER_TYPES[3]!r}: "
                "Qwen3-Next)"
            )
        if LAYER_TYPES[0] in types and self.sliding_window is None:
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
        self.attention_spec.validate(self.n_embd, self.block_size)
        if self.rotary and self.mla is None and self.head_dim % 2:
            raise ConfigError(
                f"rotary embeddings need an even head dimension, got {self.head_dim}; "
                "change architecture/head_dim, architecture/n_embd or architecture/n_heads"
            )
        self.position_spec.validate()
        self.feed_forward_spec.validate(self.n_layers)
        self.norm_spec.validate()
        self._validate_layer_types()
        if self.mla is not None:
            self.mla.validate()
        if self.final_softcap is not None and not self.final_softcap > 0:
            raise ConfigError(f"architecture/final_softcap must be positive or null, got {self.final_softcap!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"architecture/dropout must be in [0, 1), got {self.dropout}")
        return self


def preset_d_ff(preset: Preset, n_embd: int, mlp_ratio: float | None) -> int:
    ratio = preset.mlp_ratio if mlp_ratio is None else mlp_ratio
    return hidden_size(n_embd, None, ratio, preset.ffn_multiple)


def lookup_preset(presets: dict[str, Preset], name: str, family: str) -> Preset:
    if name not in presets:
        raise ConfigError(f"unknown architecture/preset {name!r} for {family}; choose one of {', '.join(presets)}")
    return presets[name]
